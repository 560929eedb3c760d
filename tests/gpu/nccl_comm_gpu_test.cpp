// The NCCL building block of tensor parallelism (kernels/nccl_comm.h) on the GPUs of this host:
// an all-reduce of seeded fp32 partials against the CPU reference's fixed-order CpuTpGroup (equal
// bits up to two ranks, where a + b = b + a; within a stated tolerance above, where NCCL's ring
// order is its own), run twice bit for bit, and an all-gather equal to the concatenation. One
// GPU gives a one-rank group (a copy); the two-GPU machine is where it means something.
#include "core/check.h"
#include "core/tensor_parallel.h"
#include "kernels/nccl_comm.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;

constexpr size_t kElements = 3 * 4096 + 7;  // odd: not a multiple of any NCCL chunk

std::vector<int> visible_devices() {
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::vector<int> devices(static_cast<size_t>(std::min(count, kTpDegreeMax)));
  for (size_t i = 0; i < devices.size(); ++i) devices[i] = static_cast<int>(i);
  return devices;
}

std::vector<float> seeded_partials(size_t ranks) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> partials(ranks * kElements);
  for (float& x : partials) x = normal(rng);
  return partials;
}

// Every rank all-reduces its partials; returns rank 0's result (and checks the others equal it).
std::vector<float> all_reduce_on_devices(std::vector<NcclComm>& ranks, const std::vector<int>& devices,
                                         const std::vector<float>& partials) {
  std::vector<std::unique_ptr<DeviceBuffer<float>>> buffers;
  std::vector<cudaStream_t> streams(devices.size());
  for (size_t r = 0; r < devices.size(); ++r) {
    EXPECT_EQ(cudaSetDevice(devices[r]), cudaSuccess);
    EXPECT_EQ(cudaStreamCreate(&streams[r]), cudaSuccess);
    buffers.push_back(std::make_unique<DeviceBuffer<float>>(std::vector<float>(
        partials.begin() + static_cast<ptrdiff_t>(r * kElements),
        partials.begin() + static_cast<ptrdiff_t>((r + 1) * kElements))));
  }
  nccl_group_start();
  for (size_t r = 0; r < devices.size(); ++r) {
    ranks[r].all_reduce_sum(buffers[r]->ptr, buffers[r]->ptr, kElements, streams[r]);
  }
  nccl_group_end();
  std::vector<float> first;
  for (size_t r = 0; r < devices.size(); ++r) {
    EXPECT_EQ(cudaSetDevice(devices[r]), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(streams[r]), cudaSuccess);
    const std::vector<float> got = buffers[r]->download();
    if (r == 0) first = got;
    EXPECT_EQ(std::memcmp(got.data(), first.data(), kElements * sizeof(float)), 0)
        << "rank " << r << " holds another result than rank 0";
  }
  return first;
}

TEST(NcclComm, AllReduceEqualsTheCpuGroupAndRepeatsBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<int> devices = visible_devices();
  std::vector<NcclComm> ranks = NcclComm::for_devices(devices);
  const std::vector<float> partials = seeded_partials(devices.size());
  CpuTpGroup cpu(static_cast<int32_t>(devices.size()), 1);
  std::vector<float> expected(kElements);
  cpu.all_reduce_sum(partials, expected);
  const std::vector<float> first = all_reduce_on_devices(ranks, devices, partials);
  const std::vector<float> second = all_reduce_on_devices(ranks, devices, partials);
  std::printf("nccl: %zu ranks, %zu fp32 elements all-reduced\n", devices.size(), kElements);
  EXPECT_EQ(std::memcmp(first.data(), second.data(), kElements * sizeof(float)), 0)
      << "the pinned all-reduce differs run to run";
  double norm = 0, delta = 0;
  for (size_t i = 0; i < kElements; ++i) {
    norm = std::max(norm, std::fabs(double{expected[i]}));
    delta = std::max(delta, std::fabs(double{expected[i]} - double{first[i]}));
  }
  ASSERT_GT(norm, 0);
  if (devices.size() <= 2) {
    EXPECT_EQ(delta, 0.0) << "two partials have one sum whatever the order";
  } else {
    EXPECT_LE(delta / norm, 1e-6) << devices.size() << " ranks";  // fp32, a few re-associations
  }
}

TEST(NcclComm, AllGatherPutsTheShardsInRankOrder) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<int> devices = visible_devices();
  std::vector<NcclComm> ranks = NcclComm::for_devices(devices);
  const size_t n = devices.size();
  const std::vector<float> shards = seeded_partials(n);  // rank r's shard: [r·kElements, …)
  std::vector<std::unique_ptr<DeviceBuffer<float>>> send, recv;
  std::vector<cudaStream_t> streams(n);
  for (size_t r = 0; r < n; ++r) {
    EXPECT_EQ(cudaSetDevice(devices[r]), cudaSuccess);
    EXPECT_EQ(cudaStreamCreate(&streams[r]), cudaSuccess);
    send.push_back(std::make_unique<DeviceBuffer<float>>(std::vector<float>(
        shards.begin() + static_cast<ptrdiff_t>(r * kElements),
        shards.begin() + static_cast<ptrdiff_t>((r + 1) * kElements))));
    recv.push_back(std::make_unique<DeviceBuffer<float>>(n * kElements));
  }
  nccl_group_start();
  for (size_t r = 0; r < n; ++r) ranks[r].all_gather(send[r]->ptr, recv[r]->ptr, kElements, streams[r]);
  nccl_group_end();
  for (size_t r = 0; r < n; ++r) {
    EXPECT_EQ(cudaSetDevice(devices[r]), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(streams[r]), cudaSuccess);
    const std::vector<float> got = recv[r]->download();
    EXPECT_EQ(std::memcmp(got.data(), shards.data(), shards.size() * sizeof(float)), 0) << "rank " << r;
  }
}

TEST(NcclComm, AVariableSetToAnotherAlgorithmIsRefusedByName) {
  LS_SKIP_WITHOUT_DEVICE();
  ASSERT_EQ(setenv("NCCL_PROTO", "LL128", 1), 0);
  try {
    pin_nccl_environment();
    FAIL() << "NCCL_PROTO=LL128 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL_PROTO=LL128"), std::string::npos) << e.what();
  }
  ASSERT_EQ(unsetenv("NCCL_PROTO"), 0);
}

}  // namespace
}  // namespace ls
