# TEST ONLY: trace/trace.capnp as a future writer might extend it — the same layout plus new
# fields and a new record kind, each with a new ordinal (marked FUTURE). The reader built against
# the current schema must read files written with it (tests/trace/future_field_test.cpp).
# Keep this a copy of trace/trace.capnp's structs, with only FUTURE additions.
@0xb2f7ee93029f84e5;

$import "/capnp/c++.capnp".namespace("ls::trace::future_schema");

const traceMagic :UInt64 = 0x4543415254534c00;  # "\0LSTRACE" read as little-endian u64
const formatVersion :UInt32 = 1;

struct Record {
  union {
    header @0 :Header;
    stepInput @1 :StepInput;
    stepOutput @2 :StepOutput;
    event @3 :Event;
    footer @4 :Footer;
    stepStats @5 :StepStats;
    # FUTURE: a record kind this reader does not know; it must be skipped.
    futureNote @6 :FutureNote;
  }
}

struct FutureNote {
  text @0 :Text;
  value @1 :UInt64;
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
  drafter @13 :Text;
  foreignExecutor @14 :Text;
  stepClock @15 :Text;
  deviceTimer @16 :Text;
  tpDegree @17 :Int32 = 1;
  ncclVersion @18 :Int32;
  ncclAlgo @19 :Text;
  ncclProto @20 :Text;
  # FUTURE: a new header field.
  hostName @21 :Text;
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
}

struct Weights {
  source :union {
    seed @0 :UInt64;       # weights_from_seed(model, seed)
    directory @1 :Text;    # load_hf_directory(directory)
  }
  digest @2 :UInt64;       # ModelWeights::digest(digestForm)
  digestForm @3 :WeightsDigestForm;
}

enum WeightsDigestForm {
  stream @0;
  blocks @1;
  fromTheFuture @2;  # FUTURE enumerant: a reader of today refuses it by name
}

struct ExecutorLimits {
  maxBatchRows @0 :Int32;
  contextLength @1 :Int32;
  pageSize @2 :Int32;
  pagesCount @3 :Int32;
  verifyWidth @4 :Int32;
  prefillChunkTokens @5 :Int32;
  hostPagesCount @6 :Int32;
  mambaSlotsCount @7 :Int32;
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
  mambaWorking @12 :Int32 = -1;
  mambaCheckpointDst @13 :Int32 = -1;
  mambaCowSrc @14 :Int32 = -1;
  mambaBranchingSeqlen @15 :Int32 = -1;
  # FUTURE: a new field inside a list element struct (grows the element's data section).
  priority @16 :Int64;
}

struct StepInput {
  step @0 :Int64;
  rows @1 :List(OpRow);               # prefill rows first
  prefillTokenIds @2 :List(Int32);    # Σ prefill inputLength, row by row
  # FUTURE: a new field with a new ordinal at the end of a struct.
  recurrentSlots @3 :List(Int32);
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
  drafts @13 :List(Int32);             # [bs · W] when W > 1, else empty
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

struct StepStats {
  step @0 :Int64;
  submitNs @1 :Int64;
  doneNs @2 :Int64;
  waitNs @3 :Int64;
  deviceBusyNs @4 :Int64;
  deviceIdleBeforeNs @5 :Int64;
  pagesUsed @6 :Int32;
  pagesFree @7 :Int32;
  prefixHitTokens @8 :Int32;
  queueLength @9 :Int32;
  runningCount @10 :Int32;
}
