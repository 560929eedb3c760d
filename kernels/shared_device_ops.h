// The kernels of the shared-device collectives (kernels/tp_collectives.h): ranks of one TP group
// on one GPU exchanging through a slab in its memory. Launchers validate their arguments and
// return the launch status (STYLE.md §2–3).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

// The group's device memory: slab [2 parities, ranks, count_max] fp32 and calls [ranks], each
// rank's count of collectives so far (its parity is calls & 1; zeroed when made).
struct SharedDeviceSlab {
  float* slab;
  unsigned long long* calls;
  int32_t ranks;
  size_t count_max;
};

// slab[calls[rank] & 1][rank][0, count) = send[0, count).
cudaError_t launch_shared_deposit(SharedDeviceSlab group, int32_t rank, const float* send,
                                  size_t count, cudaStream_t stream);
// calls[rank] += 1, then waits until every rank's calls reached it (one thread spins).
cudaError_t launch_shared_barrier(SharedDeviceSlab group, int32_t rank, cudaStream_t stream);
// After the barrier: out[i] = ((slab[p][0][i] + slab[p][1][i]) + …) in rank order, p the parity
// of the call just met (calls[rank] − 1).
cudaError_t launch_shared_sum(SharedDeviceSlab group, int32_t rank, float* out, size_t count,
                              cudaStream_t stream);
// After the barrier: out[q · count + i] = slab[p][q][i] for every rank q.
cudaError_t launch_shared_gather(SharedDeviceSlab group, int32_t rank, float* out, size_t count,
                                 cudaStream_t stream);

}  // namespace ls::kernels
