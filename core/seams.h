// Link seams for the planted-bug companions of the property tests (STYLE: tests must be able to
// fail). Each function is alone in its translation unit, core/seam_*.cpp, which the production
// libraries build; the test-only libraries build a file of tests/planted/ in its place, and the
// tests linked against them must then fail. Production code carries no planted bug of its own.
#pragma once

#include <cstdint>
#include <span>

namespace ls {

struct SchedRequest;
struct OpRow;

namespace seams {

// The accepted length a decode row commits inside the step (site 1 of the context clamp,
// core/cpu_backend.cpp): the clamp. Planted (tests/planted/clamp_one_site.cpp): unclamped.
int32_t accepted_committed_in_step(int32_t accepted, int32_t vcl_old, int32_t context_length);

// The working state slot a padded token (past the step's tokens) carries in the backend's token
// buffer: −1, none (slot 0 is a real slot). Planted (tests/planted/pad_mamba_slot_zero.cpp): 0,
// as the KV slot rule pads with the dummy slot 0.
int32_t mamba_padding_slot();

// Whether a row's working slot is zeroed before the forward: a prefill row that starts the
// request from nothing (prefix 0, no copy-on-write source), so its state owes nothing to whoever
// held the slot before — the first chunk, and the first chunk again after a retraction by
// recompute. Planted (tests/planted/skip_mamba_zeroing.cpp): never, so a reused or recomputed
// slot keeps its old state.
bool mamba_zeroes_working_slot(const OpRow& row);

// Speculative decoding on a model with Mamba layers: the verify token whose after-state is a
// decode row's state once `tokens_in` (1 ≤ tokens_in ≤ W) of its W verify tokens are in — the
// commit's (tokens_in = a', the last accepted) and the page-boundary snapshot's (tokens_in =
// fb − vcl_old, seed spec §4 invariant 6 "with a drafter"): core/ops/verify_state.h's
// tokens_in − 1, which the CUDA kernels call directly. Planted
// (tests/planted/late_verify_state.cpp): one token late (capped at W − 1), so the working state
// has run one rejected draft too far.
int32_t mamba_verify_state_token(int32_t tokens_in, int32_t verify_width);

// The pages an ending request gives back to the allocator: all it holds. Planted
// (tests/planted/leak_page_on_abort.cpp): an aborted request keeps its last page.
std::span<const int32_t> pages_released_at_end(const SchedRequest& request);

// The working state slot of a request on a model with Mamba layers: its pool row − 1, so one per
// live request, freed with the row. Planted (tests/planted/share_mamba_slot.cpp): neighbouring
// pool rows share a slot.
int32_t mamba_working_slot(const SchedRequest& request);

// The page boundary a checkpoint snapshot holds the state of, for a row whose KV ends at `kv_end`
// (a multiple of page_size): kv_end. Planted (tests/planted/late_checkpoint.cpp): one page late,
// so a prefix hit resumes from the state of a page before its boundary.
int32_t checkpoint_boundary(int32_t kv_end, int32_t page_size);

// Every layer's output on the CPU reference (the residual stream after its MLP, [tokens, hidden]),
// before anything reads it: production leaves it as it is. Planted
// (tests/planted/perturb_layer_output.cpp, the `lockstep_planted_cpu` CLI): one element of one
// layer changed, which `lockstep replay --localise` must name (issue 15).
void cpu_layer_output(int32_t layer, std::span<float> residual);

}  // namespace seams
}  // namespace ls
