// The decode input-fill state op on the GPU against the CPU reference rule (slot_for and the id
// clamp in core), on odd batch sizes. Labelled `gpu`: run on the H200, skipped without a device.
#include "core/step_plan.h"
#include "kernels/state_ops.h"

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace ls {
namespace {

#define LS_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : count(n) { cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& v) { cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> v(count);
    cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  T* ptr = nullptr;
  size_t count;
};

bool have_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

class FillDecodeInputs : public ::testing::TestWithParam<int32_t> {};

TEST_P(FillDecodeInputs, MatchesTheCpuRule) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int32_t rows = GetParam();
  const int32_t w = 3, width = 5, page = 4, vocab = 512, pool = rows + 2;
  std::mt19937 rng(1234 + static_cast<uint32_t>(rows));
  std::vector<int32_t> pool_rows(rows), vcl(pool), fim(static_cast<size_t>(pool) * w),
      table(static_cast<size_t>(pool) * width);
  for (int32_t r = 0; r < rows; ++r) pool_rows[r] = 1 + (r * 7 + 3) % (pool - 1);
  for (auto& x : vcl) x = static_cast<int32_t>(rng() % (width * page + 4));  // some overflow
  for (auto& x : fim) x = static_cast<int32_t>(rng() % (vocab + 40)) - 20;  // some out of range
  for (auto& x : table) x = 1 + static_cast<int32_t>(rng() % 100);

  DeviceBuffer<int32_t> d_rows(rows), d_vcl(pool), d_fim(fim.size()), d_table(table.size()),
      d_ids(static_cast<size_t>(rows) * w), d_pos(static_cast<size_t>(rows) * w);
  DeviceBuffer<int64_t> d_slots(static_cast<size_t>(rows) * w);
  d_rows.upload(pool_rows), d_vcl.upload(vcl), d_fim.upload(fim), d_table.upload(table);
  LS_CUDA_OK(kernels::launch_fill_decode_inputs(d_rows.ptr, rows, d_vcl.ptr, d_fim.ptr, w,
                                                d_table.ptr, width, page, vocab, d_ids.ptr,
                                                d_pos.ptr, d_slots.ptr, nullptr));
  LS_CUDA_OK(cudaDeviceSynchronize());
  const auto ids = d_ids.download();
  const auto positions = d_pos.download();
  const auto slots = d_slots.download();
  int64_t overflowed = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t p = pool_rows[r];
    const std::span<const int32_t> table_row(table.data() + static_cast<size_t>(p) * width, width);
    for (int32_t t = 0; t < w; ++t) {
      const size_t i = static_cast<size_t>(r) * w + t;
      const int32_t q = vcl[p] + t;
      ASSERT_EQ(ids[i], std::clamp(fim[static_cast<size_t>(p) * w + t], 0, vocab - 1)) << i;
      ASSERT_EQ(positions[i], q) << i;
      ASSERT_EQ(slots[i], slot_for(table_row, page, q)) << i;
      overflowed += slots[i] == 0;
    }
  }
  if (rows >= 17) {
    EXPECT_GT(overflowed, 0) << "the overflow path was not exercised";
  }
}

INSTANTIATE_TEST_SUITE_P(OddBatches, FillDecodeInputs, ::testing::Values(1, 3, 17, 64));

}  // namespace
}  // namespace ls
