# The lockstep trace format. This comment is the contract; trace/reader.cpp enforces it.
#
# FILE LAYOUT (format versions 3 to 5; version 2 had the same layout and another logits digest)
#   A trace file is a 16-byte preamble, then one frame per record. All integers little-endian.
#
#   preamble  bytes 0..7    magic "\0LSTRACE" (= traceMagic as a little-endian u64)
#             bytes 8..11   u32 format version (= formatVersion)
#             bytes 12..15  u32 low 32 bits of XXH3-64(bytes 0..11)
#   frame at byte offset F (F is a multiple of 8; the first frame is at 16):
#             bytes 0..3    u32 L, the message's length in bytes (a multiple of 8, 8..64 MiB)
#             bytes 4..7    u32 header check: low 32 bits of XXH3-64 with seed F XOR
#                           0x4c53465241484452 over bytes 0..3 and 8..15 (12 bytes)
#             bytes 8..15   u64 payload check: XXH3-64 with seed F over the L message bytes
#             bytes 16..    the message: a Cap'n Proto message in the standard unpacked stream
#                           framing (capnp::writeMessage), whose segment table spans exactly L
#                           bytes, holding one `Record`.
#   Every byte of the file is under a check (the preamble's, a frame header's or a payload's),
#   and the checks are seeded with the frame's offset, so a frame moved elsewhere fails too.
#   Frames are appended in order and never rewritten, so a file cut at any byte is a complete
#   prefix of frames followed by at most one partial frame.
#
#   frame 0          Record.header      magic, format version and everything replay needs to
#                                       rebuild the executor (model, weights, limits, backend).
#   frames 1..n      Record.stepInput   written BEFORE the step executes,
#                    Record.stepOutput  written after the step completed,
#                    Record.event       request lifecycle and fault events, in between.
#                    Record.stepStats   when and how a step ran (optional; after its output).
#   last (optional)  Record.footer      written by a clean close: counts and a sparse index.
#
# READING
#   A frame whose bytes are all present must check out: a header or payload check that does not
#   match, anywhere before the end of the file, is corruption inside the file (the reader names
#   the frame's offset, the step before it and how many later frames still check out; replay
#   and check exit 2). The file ending inside a frame, or after the last whole frame without a
#   footer, is a torn tail (a killed writer): the complete prefix is read, and the reader says
#   where it ends, how many bytes of a partial frame it dropped and that the footer is missing.
#   A file without the preamble is refused: if its first message is a header of an older
#   format version (1: plain stream framing, no checks), the error names that version.
#
# ORDERING RULES (the reader rejects a file that breaks one, naming record, step and field)
#   - Step indices of stepInput records strictly increase (gaps are allowed: an op that failed
#     validation is replaced by an event of kind stepRejected and never appears as an input).
#   - A stepOutput closes the oldest open step: its step index equals that input's. At most 2
#     steps are open at once (an overlapped executor records input k+1 before output k).
#   - An event carries the step at which it happened (>= 0); a stepRejected event whose step is
#     the oldest open step closes that step.
#   - A stepStats record follows the output of its step (its step is the last completed one),
#     at most one per step.
#   - Nothing follows a footer.
#   - Events: steps never decrease from one event to the next, and an event's step is at least
#     the last step input's (and a step input's at least the last event's). An event names a
#     request the trace knows: arrive introduces one (not already in flight), a step input row
#     does too; finish and abort end it; finish, abort, retract and recover must name a known
#     request; faultFired names 0, a known request or one of the last step's rows; stepRejected
#     names none (0).
#   A step is *complete* when its output record has been read.
#
# LIMITS AND VALIDATION
#   Every index is checked against the header before use: pool rows in 1..maxBatchRows, pages in
#   [1, pagesCount), token ids in [0, vocabSize), lengths within contextLength and
#   prefillChunkTokens, list lengths consistent with the row counts; the decoded op must pass
#   ls::validate_forward_op. Each message is read with its own capnp::ReaderOptions, so traversal
#   and nesting limits apply per record; a message larger than 64 MiB is rejected.
#
# DIGESTS AND TOP-K (header.captureLogits: every stepOutput carries both for every logits row;
# otherwise neither. The executor computes them inside the step, where the logits are: on the
# device for CUDA (kernels/logits_ops.cu), in the CPU backend (core/logits_digest.cpp).)
#   logitsDigests[i]       of logits row i, the V float32 values after the NaN guard (what the
#                          sampler read); logits rows are one per prefill row, then W per decode
#                          row. With u_j the bits of value j (uint32), arithmetic mod 2^32:
#                            p_j = (u_j XOR (j * 0x9E3779B1)) * 0x85EBCA6B as a 64-bit product
#                            a_j = (p_j >> 32) XOR (p_j mod 2^32)
#                            b_j = (u_j XOR 0x7F4A7C15) * (2j + 1)
#                            A = sum of a_j, B = sum of b_j
#                            digest = fmix64(((A << 32) | B) XOR (V * 0x9E3779B97F4A7C15) mod 2^64)
#                          fmix64 is MurmurHash3's finaliser. The sums make the value
#                          independent of the order a parallel reduction adds the terms in.
#                          (Format 2 had a_j = fmix32(u_j XOR (j * 0x9E3779B1)): the version
#                          changed so that no reader compares digests of the two definitions.)
#   topLogits              the top `topLogitsCount` (id, logit) pairs of each logits row (after
#                          the guard), by logit descending, lower id first on ties, NaN last, −0
#                          equal to +0. The reader checks each row's pairs are in that order with
#                          finite logits; `lockstep check` that a greedy row emitted each row's
#                          top-1; replay compares them (exact) or measures |Δlogit| at their ids
#                          (teacher-forced).
#   validCacheLengths[r]   not a digest: the vcl of op row r's pool row after the step, exact.
#   futureInputDigests[r]  XXH3-64, seed 0, over the W int32 future_input_map entries of op row
#                          r's pool row after the step.
#   mambaStateDigests[r]   (header.mambaStateDigests: a model with Mamba layers) the recurrent
#                          state of op row r's working slot (OpRow.mambaWorking) after the step,
#                          its checkpoint snapshot included: the logits digest above over the
#                          slot's N float32 values, V = N, in this order — for each Mamba layer
#                          in layer order, the conv window [convDim, convKernel] (row-major, the
#                          oldest input first) then the SSM state [heads, headDim, stateSize].
#                          Exact replay compares them (field mamba_state_digest); the reader
#                          checks there is one per row exactly when the header says so.
#
# ACTIVATIONS (header.activationDigests, `--record-activations`; core/activations.h is the
# definition both backends compute)
#   activationDigests      one digest per (tensor, row) of the step, in this order: for each layer
#                          l in order, the tensors attn_in (the attention input after its norm,
#                          [T, hidden]), q (after bias, head norm and RoPE, [T, qSize]), k and v
#                          (as written to the KV cache, [T, kvSize]), attn_out (before the o
#                          product, [T, qSize]), mlp_out (the residual after the layer's MLP,
#                          [T, hidden]); then final_norm ([R, hidden]) and logits (before the NaN
#                          guard, [R, V]); each tensor row by row. T = the step's tokens (prefill
#                          tokens, then W per decode row), R = its logits rows. A row's digest is
#                          the logits digest above over its values as fp32 (a bf16 tensor widened
#                          exactly), V = the row's width. So the count is layers·6·T + 2·R, which
#                          the reader checks (exactly when the header says so; the model must have
#                          no Mamba layers and tpDegree must be 1). Additive: older readers skip
#                          it and the format version stays 4. `lockstep replay --localise` compares
#                          them to name the first tensor where a replayed step departs.
#
# TENSOR PARALLELISM (header.tpDegree = N > 1)
#   The outputs were computed by N ranks with the weights split the Megatron way and the
#   row-parallel partials (after o and after down) summed in rank order. Exact replay rebuilds
#   the same degree (it refuses another: TP N equals TP 1 only within a tolerance); teacher-forced
#   replay may run at any degree the model shards to. The reader checks 1 <= tpDegree <= 8.
#   On CUDA the sums are NCCL's, with NCCL_ALGO and NCCL_PROTO pinned (one reduction order
#   whatever the message size) and recorded with NCCL's version (ncclVersion, ncclAlgo,
#   ncclProto); the reader checks they are all set or all empty, and set only when tpDegree > 1.
#
# EVOLUTION
#   Add fields and union members with NEW ORDINALS only; never renumber, retype or remove. A
#   reader ignores fields it does not know. (Issue 19's mambaStateDigests is such an addition:
#   a reader from before skips them, and their header flag reads false in older files.)
#   `formatVersion` changes only when a reader of an older version must refuse the file;
#   additive changes keep it. Version 4 adds CacheOp.stateSlot: a version-3 reader would skip
#   it and replay a hybrid's swap without its state, so version-3 readers must refuse version-4
#   files; a version-4 reader reads version-3 files, whose cache ops never carried a state, with
#   every stateSlot −1. Version 5 adds Weights.digestForm (blocks, hashed on every core): a
#   version-4 reader would check a blocks digest as a stream one and call the right weights
#   wrong, so it must refuse version-5 files; a version-5 reader reads versions 3 and 4, whose
#   digests are all of the stream form, with digestForm stream. Version 2 (checksummed framing)
#   is refused by name since version 3 (a cheaper logits digest, DIGESTS); version 1 files (no
#   framing) are refused by name.
@0xd9fcced0f1a776b6;

$import "/capnp/c++.capnp".namespace("ls::trace::schema");

const traceMagic :UInt64 = 0x4543415254534c00;  # "\0LSTRACE" read as little-endian u64
const formatVersion :UInt32 = 5;

struct Record {
  union {
    header @0 :Header;
    stepInput @1 :StepInput;
    stepOutput @2 :StepOutput;
    event @3 :Event;
    footer @4 :Footer;
    stepStats @5 :StepStats;   # issue 17; a reader from before skips it
  }
}

struct Header {
  magic @0 :UInt64;
  formatVersion @1 :UInt32;
  buildId @2 :Text;

  model @3 :ModelShape;
  weights @4 :Weights;
  executor @5 :ExecutorLimits;
  captureLogits @6 :Bool;    # the outputs carry logits digests and top-k logits (DIGESTS)
  wantLogprobs @7 :Bool;
  topLogitsCount @8 :Int32;  # (id, logit) pairs recorded per logits row, 0..8

  backend @9 :Text;
  determinismMode @10 :Text; # "batch-invariant" (a row's results depend on its own inputs alone:
                             # the CPU reference, CUDA with --determinism invariant; replay
                             # --isolate needs it), "default" (no such promise), "foreign" (an
                             # engine's own executor, python/), or empty (no promise); any other
                             # value is refused
  machine @11 :Machine;
  indexStride @12 :Int32;    # the footer indexes step input records 0, stride, 2·stride, …
  drafter @13 :Text;         # "none" (or empty: a trace from before drafters), "ngram", …
  foreignExecutor @14 :Text; # empty: lockstep's executor produced the outputs; else the engine
                             # whose own executor did (TraceWriter). Such a trace has no state
                             # digests (futureInputDigests may be empty), and its weights digest
                             # may be 0 (not recorded); `check` and teacher-forced replay accept
                             # it, exact replay refuses it.
  # Issue 17: the clocks of the stepStats records ("" when the trace has none).
  stepClock @15 :Text;       # "steady" (the host's monotonic clock), "simulated" (the simulator's)
  deviceTimer @16 :Text;     # "cuda-events", "host-clock" (the CPU computes the step on the host
                             # thread: the clock is its timer), "simulated"
  # Issue 18: the tensor-parallel degree the outputs were computed at, 1..8 (TENSOR PARALLELISM).
  # A trace from before the field reads as 1, which it was.
  tpDegree @17 :Int32 = 1;
  # Issue 18 (CUDA): the library that ran a TP > 1 trace's collectives, with its pinned algorithm
  # and protocol (NCCL_ALGO, NCCL_PROTO: TENSOR PARALLELISM). 0 and "" when none ran: TP 1, the
  # CPU reference's simulated ranks, and traces from before the fields.
  ncclVersion @18 :Int32;    # ncclGetVersion, e.g. 22703 for 2.27.3
  ncclAlgo @19 :Text;        # "Ring"
  ncclProto @20 :Text;       # "Simple"
  # Issue 19: every stepOutput carries mambaStateDigests, one per op row (DIGESTS). Set only for a
  # model with Mamba layers; false in traces from before the field, whose outputs carry none.
  mambaStateDigests @21 :Bool;
  # Every output carries per-layer activation digests (ACTIVATIONS; --record-activations).
  activationDigests @22 :Bool;
}

struct ModelShape {
  name @0 :Text;
  hiddenSize @1 :Int32;
  layersCount @2 :Int32;
  queryHeadsCount @3 :Int32;
  kvHeadsCount @4 :Int32;
  headDim @5 :Int32;
  ffnSize @6 :Int32;
  vocabSize @7 :Int32;
  ropeTheta @8 :Float32;
  rmsEps @9 :Float32;
  tiedEmbeddings @10 :Bool;
  # Issue 11: the family and everything that changes its arithmetic, so replay rebuilds the same
  # model. A trace from before these fields reads as a Llama with default RoPE, which it was.
  family @11 :Text;                  # "llama", "qwen2", "qwen3", "mistral" ("" = llama)
  ropeType @12 :Text;                # "default", "linear", "llama3" ("" = default)
  ropeFactor @13 :Float32 = 1.0;     # linear, llama3
  ropeLowFreqFactor @14 :Float32 = 1.0;        # llama3
  ropeHighFreqFactor @15 :Float32 = 4.0;       # llama3
  ropeOriginalMaxPositions @16 :Int32 = 8192;  # llama3
  qkvBias @17 :Bool;                 # q/k/v projection biases (Qwen2)
  qkNorm @18 :Bool;                  # per-head RMSNorm on q and k (Qwen3)
  maxPositions @19 :Int32;           # max_position_embeddings; 0 = no bound
  slidingWindow @20 :Int32;          # 0 = none
  # Issue 19: a hybrid's layer-kind table (0 attention, 1 mamba2; empty: every layer attends) and
  # its Mamba2 mixer (ModelConfig::mamba).
  layerKinds @21 :List(UInt8);
  mambaHeadsCount @22 :Int32;
  mambaHeadDim @23 :Int32;
  mambaGroupsCount @24 :Int32;
  mambaStateSize @25 :Int32;
  mambaConvKernel @26 :Int32;
  mambaConvBias @27 :Bool;
  mambaDtMin @28 :Float32;
  mambaDtMax @29 :Float32;
  # Partial rotary (ModelConfig::partial_rotary_dim): RoPE rotates the first partialRotaryDim dims of each
  # q/k head and passes the rest through. 0 = the whole head: a trace from before the field reads
  # as full rotary, which it was.
  partialRotaryDim @30 :Int32;
}

struct Weights {
  source :union {
    seed @0 :UInt64;       # weights_from_seed(model, seed)
    directory @1 :Text;    # load_hf_directory(directory)
  }
  digest @2 :UInt64;       # ModelWeights::digest(digestForm)
  digestForm @3 :WeightsDigestForm;  # stream in files of versions 3 and 4 (they lack the field)
}

# How Weights.digest hashes the canonical weight stream (core/model/weights.h WeightsDigestForm):
# stream = XXH3-64 of it in one pass; blocks = XXH3-64 of its 16 MiB blocks' XXH3-64s in order.
# A value this build does not know is refused by name.
enum WeightsDigestForm {
  stream @0;
  blocks @1;
}

struct ExecutorLimits {
  maxBatchRows @0 :Int32;
  contextLength @1 :Int32;
  pageSize @2 :Int32;
  pagesCount @3 :Int32;
  verifyWidth @4 :Int32;
  prefillChunkTokens @5 :Int32;
  hostPagesCount @6 :Int32;
  mambaSlotsCount @7 :Int32;         # recurrent-state slots (issue 19); 0 = none
}

struct Machine {
  cpuName @0 :Text;
  gpuName @1 :Text;
  smCount @2 :Int32;
  driverVersion @3 :Text;
  cudaVersion @4 :Text;
  cublasVersion @5 :Text;
}

enum RowKind {
  prefill @0;
  decode @1;
}

struct Sampling {
  temperature @0 :Float32;
  topK @1 :Int32;
  topP @2 :Float32;
  minP @3 :Float32;
  hasSeed @4 :Bool;
  seed @5 :UInt64;
}

struct OpRow {
  kind @0 :RowKind;
  requestId @1 :UInt64;
  poolRow @2 :Int32;
  inputLength @3 :Int32;
  prefixLength @4 :Int32;
  promptLength @5 :Int32;
  decodeOverride @6 :Int32;
  histTokenLength @7 :Int32;
  refreshBegin @8 :Int32;
  refreshPages @9 :List(Int32);
  sampling :union {
    none @10 :Void;
    params @11 :Sampling;
  }
  # Issue 19: recurrent-state slots (−1 = none; slot 0 is real). A trace from before them reads
  # all −1, which it was.
  mambaWorking @12 :Int32 = -1;
  mambaCheckpointDst @13 :Int32 = -1;
  mambaCowSrc @14 :Int32 = -1;
  mambaBranchingSeqlen @15 :Int32 = -1;
}

struct StepInput {
  step @0 :Int64;
  rows @1 :List(OpRow);               # prefill rows first
  prefillTokenIds @2 :List(Int32);    # Σ prefill inputLength, row by row
  cacheOps @3 :List(CacheOp);         # KV page copies that ran just before the step, in order
  faults @4 :StepFaults;              # faults planted into the step (simulator, tests); replayed
}

enum CacheOpKind {
  swapOut @0;
  swapIn @1;
}

struct CacheOp {
  kind @0 :CacheOpKind;
  devicePages @1 :List(Int32);        # in [1, pagesCount)
  hostPages @2 :List(Int32);          # in [0, hostPagesCount), pairwise with devicePages
  # Issue 19: −1, or (a model with Mamba layers, at least one page) the recurrent-state slot in
  # [0, mambaSlotsCount) whose working state travels with the pages: swapOut copies it into the
  # host state of hostPages[0], swapIn copies that host state into it. Replay re-applies the
  # copy. Older traces lack the field and read −1 (no state copied): format 3 still.
  stateSlot @3 :Int32 = -1;
}

struct StepFaults {
  poisonedRows @0 :List(Int32);       # op rows whose logits rows all become poisonValue
  poisonValue @1 :Float32;            # NaN or ±inf
  forcedRows @2 :List(Int32);         # op rows whose first output is replaced by forcedIds[i]
  forcedIds @3 :List(Int32);
}

enum ForwardMode {
  idle @0;
  extend @1;
  mixed @2;
  decode @3;
}

struct TopLogit {
  id @0 :Int32;
  logit @1 :Float32;
}

struct StepOutput {
  step @0 :Int64;
  mode @1 :ForwardMode;
  prefillRowsCount @2 :Int32;
  verifyWidth @3 :Int32;
  tokens @4 :List(Int32);              # [ne + nd·W]
  acceptedLengths @5 :List(Int32);     # [bs]
  logprobs @6 :List(Float32);          # [ne + nd·W] or empty
  nanFlags @7 :List(UInt8);            # [bs]
  oovFlags @8 :List(UInt8);            # [bs]
  logitsDigests @9 :List(UInt64);      # [logits rows] or empty
  validCacheLengths @10 :List(Int32);  # [bs]
  futureInputDigests @11 :List(UInt64);  # [bs]
  topLogits @12 :List(TopLogit);       # [logits rows · header.topLogitsCount] or empty
  drafts @13 :List(Int32);             # [bs · W] when W > 1, else empty: the future_input_map
                                       # ids of op row r's pool row after the step, i.e. the
                                       # next round's [bonus, d1 … d_{W−1}]
  mambaStateDigests @14 :List(UInt64); # [bs] when header.mambaStateDigests, else empty: the
                                       # state digest of op row r's working slot after the step
                                       # (DIGESTS)
  activationDigests @15 :List(UInt64); # when header.activationDigests, else empty (ACTIVATIONS)
}

enum EventKind {
  arrive @0;
  finish @1;
  abort @2;
  retract @3;
  recover @4;
  faultFired @5;
  stepRejected @6;  # the op of `step` failed validation; `detail` holds the error
}

struct Event {
  kind @0 :EventKind;
  requestId @1 :UInt64;
  step @2 :Int64;
  detail @3 :Text;               # finish reason, fault site, rejection message
  hasHistTokenLength @4 :Bool;
  histTokenLength @5 :Int32;
}

struct Footer {
  stepsCount @0 :Int64;          # stepInput records in the file
  outputsCount @1 :Int64;        # stepOutput records
  eventsCount @2 :Int64;
  indexStride @3 :Int32;         # stepOffsets[j] is the byte offset of stepInput record j·stride
  stepOffsets @4 :List(UInt64);
}

# When and how one step ran (issue 17), measured outside the executor's rules. Times are
# nanoseconds on header.stepClock (only differences mean anything); durations on
# header.deviceTimer.
struct StepStats {
  step @0 :Int64;
  submitNs @1 :Int64;              # the op handed to the executor
  doneNs @2 :Int64;                # its result in the host's hands
  waitNs @3 :Int64;                # host time blocked on the step's completion
  deviceBusyNs @4 :Int64;          # the step's first to last device operation
  deviceIdleBeforeNs @5 :Int64;    # device idle since the previous step ended; -1 unknown
  pagesUsed @6 :Int32;             # device pages held by requests or the prefix cache
  pagesFree @7 :Int32;
  prefixHitTokens @8 :Int32;       # prompt tokens this step's plan found in the prefix cache
  queueLength @9 :Int32;           # live requests without a pool row (waiting or retracted)
  runningCount @10 :Int32;         # requests holding a pool row
}
