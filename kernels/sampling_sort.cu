// The segmented sort of sampling keys: the only CUB instantiation of the backend, in its own file
// so it compiles once.
#include "kernels/sampling_ops.h"

#include <cub/device/device_segmented_radix_sort.cuh>

namespace ls::kernels {

size_t sort_sampling_keys_temp_bytes(int32_t rows_max, int32_t vocab) {
  size_t bytes = 0;
  const cudaError_t status = cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      rows_max * vocab, rows_max, static_cast<const int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr));
  return status == cudaSuccess ? bytes : 0;
}

cudaError_t launch_sort_sampling_keys(void* temp, size_t temp_bytes, SamplingKeys keys,
                                      int32_t rows, int32_t vocab, const int32_t* segment_offsets,
                                      cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || temp == nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return cub::DeviceSegmentedRadixSort::SortKeysDescending(
      temp, temp_bytes, keys.keys, keys.sorted_keys, rows * vocab, rows,
      segment_offsets, segment_offsets + 1, 0, 64, stream);
}

}  // namespace ls::kernels
