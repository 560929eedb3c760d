# The lockstep trace format. This comment is the contract; trace/reader.cpp enforces it.
#
# FILE LAYOUT
#   A trace file is a sequence of Cap'n Proto messages in the standard *unpacked* stream framing
#   (capnp::writeMessage: a segment table — u32 segment count − 1, u32 size in words of each
#   segment, padding to 8 bytes — then the segments). Every message is self-delimiting and holds
#   exactly one `Record`. Messages are appended in order and never rewritten, so a file cut at any
#   byte is a complete prefix of messages followed by at most one partial message.
#
#   message 0        Record.header      magic, format version and everything replay needs to
#                                       rebuild the executor (model, weights, limits, backend).
#   messages 1..n    Record.stepInput   written BEFORE the step executes,
#                    Record.stepOutput  written after the step completed,
#                    Record.event       request lifecycle and fault events, in between.
#   last (optional)  Record.footer      written by a clean close: counts and a sparse index.
#
# ORDERING RULES (the reader rejects a file that breaks one, naming record, step and field)
#   - Step indices of stepInput records strictly increase (gaps are allowed: an op that failed
#     validation is replaced by an event of kind stepRejected and never appears as an input).
#   - A stepOutput closes the oldest open step: its step index equals that input's. At most 2
#     steps are open at once (an overlapped executor records input k+1 before output k).
#   - An event carries the step at which it happened (>= 0); a stepRejected event whose step is
#     the oldest open step closes that step.
#   - Nothing follows a footer.
#   A step is *complete* when its output record has been read. A file whose tail is cut off is
#   reported as "trace ends inside step S; N complete steps" and its complete prefix is usable.
#
# LIMITS AND VALIDATION
#   Every index is checked against the header before use: pool rows in 1..maxBatchRows, pages in
#   [1, pagesCount), token ids in [0, vocabSize), lengths within contextLength and
#   prefillChunkTokens, list lengths consistent with the row counts; the decoded op must pass
#   ls::validate_forward_op. Each message is read with its own capnp::ReaderOptions, so traversal
#   and nesting limits apply per record; a message larger than 64 MiB is rejected.
#
# DIGESTS (all XXH3-64, seed 0, over little-endian bytes)
#   logitsDigests[i]       over logits row i's V float32 values (empty when logits were not
#                          captured); logits rows are one per prefill row, then W per decode row.
#   validCacheLengths[r]   not a digest: the vcl of op row r's pool row after the step, exact.
#   futureInputDigests[r]  over the W int32 future_input_map entries of op row r's pool row
#                          after the step.
#   topLogits              the top `topLogitsCount` (id, logit) pairs of each logits row, by logit
#                          descending, lower id first on ties, NaN last.
#
# EVOLUTION
#   Add fields and union members with NEW ORDINALS only; never renumber, retype or remove. A
#   reader ignores fields it does not know. `formatVersion` changes only when a reader of an
#   older version must refuse the file; additive changes keep it.
@0xd9fcced0f1a776b6;

$import "/capnp/c++.capnp".namespace("ls::trace::schema");

const traceMagic :UInt64 = 0x4543415254534c00;  # "\0LSTRACE" read as little-endian u64
const formatVersion :UInt32 = 1;

struct Record {
  union {
    header @0 :Header;
    stepInput @1 :StepInput;
    stepOutput @2 :StepOutput;
    event @3 :Event;
    footer @4 :Footer;
  }
}

struct Header {
  magic @0 :UInt64;
  formatVersion @1 :UInt32;
  buildId @2 :Text;

  model @3 :ModelShape;
  weights @4 :Weights;
  executor @5 :ExecutorLimits;
  captureLogits @6 :Bool;
  wantLogprobs @7 :Bool;
  topLogitsCount @8 :Int32;  # (id, logit) pairs recorded per logits row, 0..8

  backend @9 :Text;
  determinismMode @10 :Text;
  machine @11 :Machine;
  indexStride @12 :Int32;    # the footer indexes step input records 0, stride, 2·stride, …
  drafter @13 :Text;         # "none" (or empty: a trace from before drafters), "ngram", …
  foreignExecutor @14 :Text; # empty: lockstep's executor produced the outputs; else the engine
                             # whose own executor did (TraceWriter). Such a trace has no state
                             # digests (futureInputDigests may be empty), and its weights digest
                             # may be 0 (not recorded); `check` and teacher-forced replay accept
                             # it, exact replay refuses it.
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
}

struct Weights {
  source :union {
    seed @0 :UInt64;       # weights_from_seed(model, seed)
    directory @1 :Text;    # load_hf_directory(directory)
  }
  digest @2 :UInt64;       # ModelWeights::digest()
}

struct ExecutorLimits {
  maxBatchRows @0 :Int32;
  contextLength @1 :Int32;
  pageSize @2 :Int32;
  pagesCount @3 :Int32;
  verifyWidth @4 :Int32;
  prefillChunkTokens @5 :Int32;
  hostPagesCount @6 :Int32;
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
