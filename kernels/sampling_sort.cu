// The sort of sampling keys: the backend's only CUB instantiations, in their own file so they
// compile once. A step with few sampled rows sorts each row with the device-wide radix sort (every
// SM on one row); more rows, one segmented sort (a block a row). Both give the same order: the keys
// are distinct, so the descending order is unique.
#include "kernels/sampling_ops.h"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <algorithm>

namespace ls::kernels {

namespace {

// Up to this many rows, one device-wide sort a row: a segmented sort gives each row one block,
// which at batch 1 leaves the rest of the GPU idle through every radix pass.
constexpr int32_t kRowsSortedAlone = 4;

size_t row_sort_temp_bytes(int32_t vocab) {
  size_t bytes = 0;
  const cudaError_t status = cub::DeviceRadixSort::SortKeysDescending(
      nullptr, bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      vocab);
  return status == cudaSuccess ? bytes : 0;
}

size_t segmented_sort_temp_bytes(int32_t rows_max, int32_t vocab) {
  size_t bytes = 0;
  const cudaError_t status = cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      rows_max * vocab, rows_max, static_cast<const int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr));
  return status == cudaSuccess ? bytes : 0;
}

}  // namespace

size_t sort_sampling_keys_temp_bytes(int32_t rows_max, int32_t vocab) {
  const size_t alone = row_sort_temp_bytes(vocab);
  const size_t segmented = segmented_sort_temp_bytes(rows_max, vocab);
  return alone == 0 || segmented == 0 ? 0 : std::max(alone, segmented);
}

cudaError_t launch_sort_sampling_keys(void* temp, size_t temp_bytes, SamplingKeys keys,
                                      int32_t rows, int32_t vocab, const int32_t* segment_offsets,
                                      cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || temp == nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (rows <= kRowsSortedAlone) {
    for (int32_t r = 0; r < rows; ++r) {
      size_t bytes = temp_bytes;
      const cudaError_t status = cub::DeviceRadixSort::SortKeysDescending(
          temp, bytes, keys.keys + int64_t{r} * vocab, keys.sorted_keys + int64_t{r} * vocab,
          vocab, 0, sampling_key_bits(vocab), stream);
      if (status != cudaSuccess) return status;
    }
    return cudaSuccess;
  }
  return cub::DeviceSegmentedRadixSort::SortKeysDescending(
      temp, temp_bytes, keys.keys, keys.sorted_keys, rows * vocab, rows,
      segment_offsets, segment_offsets + 1, 0, sampling_key_bits(vocab), stream);
}

}  // namespace ls::kernels
