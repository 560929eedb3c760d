// cuBLASLt matrix products with their algorithm chosen once per shape and then pinned: the bf16
// linear layers of the CUDA backend for steps too wide for lockstep's GEMV.
//
// y[tokens, out] = x[tokens, in] · w[out, in]ᵀ + beta · y, bf16 operands, fp32 accumulation and
// fp32 output (beta = 1 fuses the residual add). Plan, then run (STYLE.md §4): prepare() makes a
// shape's plan (descriptors and the heuristic's first algorithm for the fixed workspace) — the
// CUDA backend prepares every shape its steps can run at construction, every token count of every
// linear layer — and run() only enqueues a plan that find() looked up: the launch path queries no
// heuristic, allocates nothing and takes no lock, and a shape always runs the same algorithm with
// the same workspace: bit-identical run to run. Descriptors live in the plan table (cuBLASLt's
// opaque structs, initialised in place).
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
  // One shape's pinned product (opaque to callers: find() hands it to run()).
  struct Plan {
    int32_t tokens = 0, out = 0, in = 0;
    bool accumulate = false;  // made for beta != 0
    cublasLtMatmulDescOpaque_t matmul{};
    cublasLtMatrixLayoutOpaque_t w_layout{}, x_layout{}, y_layout{};
    cublasLtMatmulAlgo_t algo{};
  };

  // `workspace` (device, `workspace_bytes`) is every product's one workspace; it must outlive
  // this object and is used only on `stream`.
  GemmPlans(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~GemmPlans();
  GemmPlans(const GemmPlans&) = delete;
  GemmPlans& operator=(const GemmPlans&) = delete;

  // Makes the shape's plan now (start-up: one heuristic query) if it has none.
  cublasStatus_t prepare(int32_t tokens, int32_t out, int32_t in, bool accumulate);

  // The plan prepare() made for the shape, or null when it made none: a lookup over the few
  // (out, in, accumulate) shapes, then an index by token count. Valid until the next prepare().
  Plan* find(int32_t tokens, int32_t out, int32_t in, bool accumulate);

  // Enqueues the product of `plan`'s shape on the stream; beta != 0 needs a plan made to
  // accumulate and beta == 0 one that was not (CUBLAS_STATUS_INVALID_VALUE otherwise).
  cublasStatus_t run(Plan& plan, const __nv_bfloat16* x, const __nv_bfloat16* w, float* y,
                     float beta) const;

  size_t plans_count() const { return plans_.size(); }

 private:
  // The plans of one (out, in, accumulate): plan_index[tokens] into plans_, −1 where none.
  struct Shape {
    int32_t out = 0, in = 0;
    bool accumulate = false;
    std::vector<int32_t> plan_index;
  };
  cublasStatus_t make(int32_t tokens, int32_t out, int32_t in, bool accumulate, Plan* plan) const;

  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  std::vector<Shape> shapes_;  // a model's linear layers: a handful
  std::vector<Plan> plans_;
};

}  // namespace ls::kernels
