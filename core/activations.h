// Per-layer activations of one step (issue 15, localisation): what a backend captures on request
// (Backend::capture_activations) so that replay can name the first layer and tensor where two runs
// of a step part, and what a trace records of them (trace/trace.capnp "ACTIVATIONS").
//
// Tensors, in the fixed capture order (layer-major, then the kinds in enum order, then the
// model's two last tensors), each [rows, width]:
//   per layer l:  attn_in   the attention input after its RMSNorm         [tokens, hidden]
//                 q         the queries after bias, head norm and RoPE    [tokens, q_size]
//                 k, v      the keys (after RoPE) and values the layer
//                           wrote to the KV cache at the token's slot     [tokens, kv_size]
//                 attn_out  the attention output, before the o product    [tokens, q_size]
//                 mlp_out   the residual stream after the layer's MLP
//                           (the layer's output)                          [tokens, hidden]
//   then          final_norm  the final RMSNorm of each logits token      [logits rows, hidden]
//                 logits      before the NaN guard                        [logits rows, V]
// tokens are the step's real tokens in buffer order (prefill rows' tokens, then W per decode
// row; padding excluded). Values are kept as fp32: a backend that stores a tensor in bf16 widens
// it exactly (the bf16 bits in the high half), so `values` holds the stored bits.
//
// A backend captures either the values (replay's localisation compares them element by element)
// or, for a recording, only each row's digest (the CUDA backend computes them on the device,
// kernels/activation_ops.h, and copies no tensor to the host).
//
// Digest of one tensor row: the logits digest (core/logits_digest.h) over the row's fp32 values
// as kept here, V = width. One definition for every backend; two backends that store a tensor in
// different dtypes give different digests of it, by design.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ls {

enum class ActivationKind : uint8_t {
  kAttnIn, kQ, kK, kV, kAttnOut, kMlpOut,  // per layer
  kFinalNorm, kLogits,                     // once per step
};
inline constexpr int32_t kLayerActivationKinds = 6;  // kAttnIn … kMlpOut

enum class ActivationCapture : uint8_t {
  kOff,      // nothing captured (the default: costs nothing)
  kDigests,  // each tensor row's digest only (ActivationTensor::digests)
  kValues,   // the values (ActivationTensor::values)
};

std::string_view activation_kind_name(ActivationKind kind);

struct ActivationTensor {
  int32_t layer = -1;  // −1 for final_norm and logits
  ActivationKind kind = ActivationKind::kAttnIn;
  int32_t rows = 0;
  int32_t width = 0;
  bool stored_bf16 = false;   // the backend keeps it in bf16 (values widened exactly)
  std::vector<float> values;  // [rows, width] (ActivationCapture::kValues), else empty
  std::vector<uint64_t> digests;  // [rows] (ActivationCapture::kDigests), else empty

  std::span<const float> row(int32_t r) const {
    return std::span<const float>(values).subspan(static_cast<size_t>(r) * width,
                                                  static_cast<size_t>(width));
  }
  std::string name() const;  // "layer 3 q", "logits"
  bool operator==(const ActivationTensor&) const = default;
};

// One step's tensors in the capture order above.
struct StepActivations {
  std::vector<ActivationTensor> tensors;

  bool empty() const { return tensors.empty(); }
  // Appends a [rows, width] tensor of zeros and returns it for the backend to fill: its values,
  // or (`mode` kDigests) its rows' digests.
  ActivationTensor& add(int32_t layer, ActivationKind kind, int32_t rows, int32_t width,
                        bool stored_bf16 = false, ActivationCapture mode = ActivationCapture::kValues);
  // kValues → kDigests: each tensor's rows digested, its values dropped.
  void keep_digests_only();
  bool operator==(const StepActivations&) const = default;
};

// The digest of one tensor row (above).
uint64_t activation_row_digest(std::span<const float> row);
// Every row's digest, tensor by tensor in order (from the values, or the digests captured): what
// the trace records.
std::vector<uint64_t> activation_digests(const StepActivations& activations);
// How many digests a step of `tokens` tokens and `logits_rows` logits rows records for a model of
// `layers` layers (the reader checks the recorded count against it).
int64_t activation_digests_count(int32_t layers, int32_t tokens, int32_t logits_rows);

// Where digest index i of a step lies: which tensor (layer, kind) and which row.
struct ActivationSite {
  int32_t layer = -1;
  ActivationKind kind = ActivationKind::kAttnIn;
  int32_t row = 0;
  std::string name() const;
};
ActivationSite activation_site(int32_t layers, int32_t tokens, int32_t logits_rows, int64_t index);

// The first place two captures of one step part. Both in-process: `bitwise` compares bits (the
// same backend twice); otherwise an element differs when |a − b| > tolerance · max|b| over its row
// (b the reference side), a scale-free test for bf16 against fp32.
struct ActivationDifference {
  std::string tensor;  // ActivationTensor::name()
  int32_t layer = -1;
  ActivationKind kind = ActivationKind::kAttnIn;
  int32_t row = 0;
  int32_t element = 0;
  float actual = 0;    // the replay side
  float expected = 0;  // the other side
  double row_scale = 0;  // max|expected| over the row (tolerance mode)
};
std::optional<ActivationDifference> first_activation_difference(const StepActivations& actual,
                                                                const StepActivations& expected,
                                                                std::optional<double> tolerance);

}  // namespace ls
