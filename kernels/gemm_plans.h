// cuBLASLt matrix products with their algorithm chosen once per shape and then pinned: the bf16
// linear layers of the CUDA backend for steps too wide for lockstep's GEMV.
//
// y[tokens, out] = x[tokens, in] · w[out, in]ᵀ + beta · y, bf16 operands, fp32 accumulation and
// fp32 output (beta = 1 fuses the residual add). A shape's plan (descriptors and the heuristic's
// first algorithm for the fixed workspace) is made the first time the shape is seen — with graphs,
// the capture's warm-ups at start-up see every decode bucket's shapes; a prefill chunk's (its
// token count varies) are made at its first step, a heuristic query on that step's host path
// (TODO(perf), issue 14: every plan at start-up) — and reused as is
// for every later product of that shape, so a shape always runs the same algorithm with the same
// workspace: bit-identical run to run. Descriptors live in the plan table (cuBLASLt's opaque
// structs, initialised in place), so a product allocates nothing; a new shape costs one heuristic
// query on the host.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ls::kernels {

class GemmPlans {
 public:
  // `workspace` (device, `workspace_bytes`) is every product's one workspace; it must outlive
  // this object and is used only on `stream`.
  GemmPlans(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~GemmPlans();
  GemmPlans(const GemmPlans&) = delete;
  GemmPlans& operator=(const GemmPlans&) = delete;

  // Makes the shape's plan now (start-up) if it has none.
  cublasStatus_t prepare(int32_t tokens, int32_t out, int32_t in, bool accumulate);

  // Enqueues the product on the stream (tokens == 0: nothing).
  cublasStatus_t run(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int32_t tokens,
                     int32_t out, int32_t in, float beta);

  size_t plans_count() const { return plans_.size(); }

 private:
  struct Plan {
    int32_t tokens = 0, out = 0, in = 0;
    bool accumulate = false;
    cublasLtMatmulDescOpaque_t matmul{};
    cublasLtMatrixLayoutOpaque_t w_layout{}, x_layout{}, y_layout{};
    cublasLtMatmulAlgo_t algo{};
  };
  cublasStatus_t find(int32_t tokens, int32_t out, int32_t in, bool accumulate, Plan** plan);
  cublasStatus_t make(int32_t tokens, int32_t out, int32_t in, bool accumulate, Plan* plan) const;

  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  std::vector<Plan> plans_;  // searched linearly: a model has a handful of shapes per token count
};

}  // namespace ls::kernels
