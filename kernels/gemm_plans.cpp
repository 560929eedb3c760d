#include "kernels/gemm_plans.h"

#include <algorithm>

namespace ls::kernels {

namespace {

#define LS_LT_TRY(call)                              \
  do {                                               \
    const cublasStatus_t status_ = (call);           \
    if (status_ != CUBLAS_STATUS_SUCCESS) return status_; \
  } while (0)

template <typename T>
cublasStatus_t set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const T& value) {
  return cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value));
}

}  // namespace

GemmPlans::GemmPlans(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  if (cublasLtCreate(&handle_) != CUBLAS_STATUS_SUCCESS) handle_ = nullptr;
}

GemmPlans::~GemmPlans() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

// Column-major view of the row-major product: yᵀ [out, tokens] = (w stored as [in, out])ᵀ · xᵀ
// [in, tokens].
cublasStatus_t GemmPlans::make(int32_t tokens, int32_t out, int32_t in, bool accumulate,
                               Plan* plan) const {
  plan->tokens = tokens, plan->out = out, plan->in = in, plan->accumulate = accumulate;
  cublasLtMatmulDesc_t desc = &plan->matmul;
  LS_LT_TRY(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LS_LT_TRY(set(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  LS_LT_TRY(set(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  LS_LT_TRY(cublasLtMatrixLayoutInit(&plan->w_layout, CUDA_R_16BF, static_cast<uint64_t>(in),
                                     static_cast<uint64_t>(out), in));
  LS_LT_TRY(cublasLtMatrixLayoutInit(&plan->x_layout, CUDA_R_16BF, static_cast<uint64_t>(in),
                                     static_cast<uint64_t>(tokens), in));
  LS_LT_TRY(cublasLtMatrixLayoutInit(&plan->y_layout, CUDA_R_32F, static_cast<uint64_t>(out),
                                     static_cast<uint64_t>(tokens), out));
  cublasLtMatmulPreferenceOpaque_t preference{};
  LS_LT_TRY(cublasLtMatmulPreferenceInit(&preference));
  const uint64_t bytes = workspace_bytes_;
  LS_LT_TRY(cublasLtMatmulPreferenceSetAttribute(&preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &bytes, sizeof(bytes)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  LS_LT_TRY(cublasLtMatmulAlgoGetHeuristic(handle_, desc, &plan->w_layout, &plan->x_layout,
                                           &plan->y_layout, &plan->y_layout, &preference, 1,
                                           &result, &found));
  if (found < 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  plan->algo = result.algo;
  return CUBLAS_STATUS_SUCCESS;
}

GemmPlans::Plan* GemmPlans::find(int32_t tokens, int32_t out, int32_t in, bool accumulate) {
  for (const Shape& shape : shapes_) {
    if (shape.out != out || shape.in != in || shape.accumulate != accumulate) continue;
    if (tokens < 0 || static_cast<size_t>(tokens) >= shape.plan_index.size()) return nullptr;
    const int32_t index = shape.plan_index[static_cast<size_t>(tokens)];
    return index < 0 ? nullptr : &plans_[static_cast<size_t>(index)];
  }
  return nullptr;
}

cublasStatus_t GemmPlans::prepare(int32_t tokens, int32_t out, int32_t in, bool accumulate) {
  if (tokens < 1 || out < 1 || in < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (handle_ == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (find(tokens, out, in, accumulate) != nullptr) return CUBLAS_STATUS_SUCCESS;
  Plan made;
  LS_LT_TRY(make(tokens, out, in, accumulate, &made));
  auto shape = std::find_if(shapes_.begin(), shapes_.end(), [&](const Shape& s) {
    return s.out == out && s.in == in && s.accumulate == accumulate;
  });
  if (shape == shapes_.end()) {
    shapes_.push_back(Shape{.out = out, .in = in, .accumulate = accumulate, .plan_index = {}});
    shape = shapes_.end() - 1;
  }
  const size_t at = static_cast<size_t>(tokens);
  if (shape->plan_index.size() <= at) shape->plan_index.resize(at + 1, -1);
  shape->plan_index[at] = static_cast<int32_t>(plans_.size());
  plans_.push_back(made);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t GemmPlans::run(Plan& plan, const __nv_bfloat16* x, const __nv_bfloat16* w,
                              float* y, float beta) const {
  if ((beta != 0.0f) != plan.accumulate) return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha = 1.0f;
  return cublasLtMatmul(handle_, &plan.matmul, &alpha, w, &plan.w_layout, x, &plan.x_layout,
                        &beta, y, &plan.y_layout, y, &plan.y_layout, &plan.algo, workspace_,
                        workspace_bytes_, stream_);
}

}  // namespace ls::kernels
