// The scheduler's recurrent-state slots (issue 19), as a RapidCheck property over generated
// workloads on a model with Mamba layers: no two live requests share a working slot — within a
// step (two rows) or across steps (a slot handed to a request while the one that held it is still
// prefilling or decoding) — and every row's slot is in [0, mamba_slots_count). The scheduler runs
// with fake results (no model: the property is about planning), through retraction under page
// pressure (by recompute, or by swap with the state copied), with the prefix cache and its
// checkpoint slots or without, overlap on or off; every op also passes the executor's validator
// (checkpoints only where the rules allow them, no slot written twice) and the scheduler's
// accounting holds after every step. The cross-step half is the simulator's mamba-slot-owner
// checker (sim/checkers.h). It depends on the scheduler library and sim/checkers.cpp only, so the
// same property builds against lockstep_scheduler_mamba_planted
// (tests/planted/share_mamba_slot.cpp), where it must fail.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace ls::mamba_props {

struct SlotWorkload {
  int32_t max_batch_rows = 2;
  int32_t page_size = 4;
  int32_t pages_count = 40;
  int32_t prefill_chunk_tokens = 16;
  bool overlap = true;
  int32_t checkpoint_slots = 0;  // > 0: the prefix cache on, with these slots past the B working ones
  int32_t host_pages_count = 0;  // > 0: retraction may swap
  std::vector<int32_t> prompt_lengths;  // one request each
  std::vector<int32_t> new_tokens;      // [requests]

  std::string describe() const;
};

rc::Gen<SlotWorkload> gen_slot_workload();
void showValue(const SlotWorkload& w, std::ostream& os);

// "" when the workload keeps the property, else what broke (step, request, slot).
std::string working_slots_never_shared(const SlotWorkload& w);

// Runs the property over `cases` generated workloads (a fixed seed unless RC_PARAMS says
// otherwise); the shrunk counterexample's description when one fails, nullopt when none does.
std::optional<std::string> counterexample(int cases);

}  // namespace ls::mamba_props
