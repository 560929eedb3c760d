#include "kernels/record_ops.h"

#include "kernels/record_state.cuh"

namespace ls::kernels {

namespace {

constexpr int32_t kThreads = 128;

// One block per op row: its pool row's vcl, future inputs and table row.
__global__ void __launch_bounds__(kThreads)
record_state_kernel(StepInputs in, DeviceState state, RecordBuffers out) {
  const int32_t y = blockIdx.x;
  if (y < in.header->rows_count) snapshot_row(in, state, out, y, kThreads);
}

}  // namespace

cudaError_t launch_record_state(StepInputs in, DeviceState state, int32_t rows_grid,
                                RecordBuffers out, cudaStream_t stream) {
  if (rows_grid < 0 || rows_grid > 65535 || in.header == nullptr || out.vcl == nullptr ||
      out.future_inputs == nullptr || out.table == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows_grid == 0) return cudaSuccess;
  record_state_kernel<<<rows_grid, kThreads, 0, stream>>>(in, state, out);
  return cudaGetLastError();
}

}  // namespace ls::kernels
