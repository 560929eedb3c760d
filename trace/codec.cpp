#include "trace/codec.h"

#include "core/check.h"
#include "core/drafter.h"
#include "trace/checks.h"

#include <string>

namespace ls::trace::codec {

namespace {

template <typename T, typename List>
void copy_list(List in, std::vector<T>& out) {
  out.resize(in.size());
  for (unsigned i = 0; i < in.size(); ++i) out[i] = static_cast<T>(in[i]);
}

template <typename ListBuilder, typename T>
void fill_list(ListBuilder out, const std::vector<T>& in) {
  for (unsigned i = 0; i < in.size(); ++i) out.set(i, in[i]);
}

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

void encode_sampling(const SamplingParams& s, schema::Sampling::Builder out) {
  out.setTemperature(s.temperature);
  out.setTopK(s.top_k);
  out.setTopP(s.top_p);
  out.setMinP(s.min_p);
  out.setHasSeed(s.seed.has_value());
  out.setSeed(s.seed.value_or(0));
}

SamplingParams decode_sampling(schema::Sampling::Reader in) {
  SamplingParams s;
  s.temperature = in.getTemperature();
  s.top_k = in.getTopK();
  s.top_p = in.getTopP();
  s.min_p = in.getMinP();
  if (in.getHasSeed()) s.seed = in.getSeed();
  return s;
}

void encode_row(const OpRow& row, schema::OpRow::Builder out) {
  out.setKind(row.kind == RowKind::kPrefill ? schema::RowKind::PREFILL : schema::RowKind::DECODE);
  out.setRequestId(row.request_id);
  out.setPoolRow(row.pool_row);
  out.setInputLength(row.input_length);
  out.setPrefixLength(row.prefix_length);
  out.setPromptLength(row.prompt_length);
  out.setDecodeOverride(row.decode_override);
  out.setHistTokenLength(row.hist_token_length);
  out.setRefreshBegin(row.refresh.begin);
  fill_list(out.initRefreshPages(static_cast<unsigned>(row.refresh.pages.size())),
            row.refresh.pages);
  if (row.sampling) {
    encode_sampling(*row.sampling, out.getSampling().initParams());
  } else {
    out.getSampling().setNone();
  }
  out.setMambaWorking(row.mamba_working);
  out.setMambaCheckpointDst(row.mamba_checkpoint_dst);
  out.setMambaCowSrc(row.mamba_cow_src);
  out.setMambaBranchingSeqlen(row.mamba_branching_seqlen);
}

void decode_row(schema::OpRow::Reader in, unsigned index, OpRow& out) {
  const uint16_t kind = static_cast<uint16_t>(in.getKind());
  LS_REQUIRE(kind <= 1, "rows[{}].kind = {} is neither prefill (0) nor decode (1)", index, kind);
  out.kind = kind == 0 ? RowKind::kPrefill : RowKind::kDecode;
  out.request_id = in.getRequestId();
  out.pool_row = in.getPoolRow();
  out.input_length = in.getInputLength();
  out.prefix_length = in.getPrefixLength();
  out.prompt_length = in.getPromptLength();
  out.decode_override = in.getDecodeOverride();
  out.hist_token_length = in.getHistTokenLength();
  out.refresh.begin = in.getRefreshBegin();
  copy_list(in.getRefreshPages(), out.refresh.pages);
  out.mamba_working = in.getMambaWorking();
  out.mamba_checkpoint_dst = in.getMambaCheckpointDst();
  out.mamba_cow_src = in.getMambaCowSrc();
  out.mamba_branching_seqlen = in.getMambaBranchingSeqlen();
  const auto sampling = in.getSampling();
  switch (sampling.which()) {
    case schema::OpRow::Sampling::NONE: out.sampling.reset(); break;
    case schema::OpRow::Sampling::PARAMS: out.sampling = decode_sampling(sampling.getParams()); break;
    default:
      throw Error(fmt::format("rows[{}].sampling holds an unknown union member {}", index,
                              static_cast<int>(sampling.which())));
  }
}

schema::ForwardMode encode_mode(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kIdle: return schema::ForwardMode::IDLE;
    case ForwardMode::kExtend: return schema::ForwardMode::EXTEND;
    case ForwardMode::kMixed: return schema::ForwardMode::MIXED;
    case ForwardMode::kDecode: return schema::ForwardMode::DECODE;
  }
  LS_ASSERT(false, "mode {}", static_cast<int>(mode));
  return schema::ForwardMode::IDLE;
}

// The header's family and rope type names; "" is what a trace from before them holds.
ModelFamily family_named(const std::string& name) {
  for (const ModelFamily f : {ModelFamily::kLlama, ModelFamily::kQwen2, ModelFamily::kQwen3,
                              ModelFamily::kMistral, ModelFamily::kBamba}) {
    if (name == to_string(f)) return f;
  }
  LS_REQUIRE(name.empty(), "model.family '{}' is not a family this build knows", name);
  return ModelFamily::kLlama;
}

RopeType rope_type_named(const std::string& name) {
  for (const RopeType t : {RopeType::kDefault, RopeType::kLinear, RopeType::kLlama3}) {
    if (name == to_string(t)) return t;
  }
  LS_REQUIRE(name.empty(), "model.ropeType '{}' is not a rope type this build knows", name);
  return RopeType::kDefault;
}

schema::WeightsDigestForm encode_digest_form(WeightsDigestForm form) {
  switch (form) {
    case WeightsDigestForm::kStream: return schema::WeightsDigestForm::STREAM;
    case WeightsDigestForm::kBlocks: return schema::WeightsDigestForm::BLOCKS;
  }
  LS_ASSERT(false, "weights digest form {}", static_cast<int>(form));
  return schema::WeightsDigestForm::STREAM;
}

WeightsDigestForm weights_digest_form_of(schema::WeightsDigestForm form) {
  switch (form) {
    case schema::WeightsDigestForm::STREAM: return WeightsDigestForm::kStream;
    case schema::WeightsDigestForm::BLOCKS: return WeightsDigestForm::kBlocks;
  }
  throw Error(fmt::format("weights.digestForm {} is not a digest form this build knows",
                          static_cast<int>(form)));
}

}  // namespace

void encode(const TraceHeader& h, schema::Header::Builder out) {
  out.setMagic(schema::TRACE_MAGIC);
  out.setFormatVersion(h.format_version);
  out.setBuildId(h.build_id);
  auto m = out.initModel();
  m.setName(h.model.name);
  m.setHiddenSize(h.model.hidden_size);
  m.setLayersCount(h.model.layers_count);
  m.setQueryHeadsCount(h.model.query_heads_count);
  m.setKvHeadsCount(h.model.kv_heads_count);
  m.setHeadDim(h.model.head_dim);
  m.setFfnSize(h.model.ffn_size);
  m.setVocabSize(h.model.vocab_size);
  m.setRopeTheta(h.model.rope_theta);
  m.setRmsEps(h.model.rms_eps);
  m.setTiedEmbeddings(h.model.tied_embeddings);
  m.setFamily(std::string(to_string(h.model.family)));
  m.setRopeType(std::string(to_string(h.model.rope_type)));
  m.setRopeFactor(h.model.rope_factor);
  m.setRopeLowFreqFactor(h.model.rope_low_freq_factor);
  m.setRopeHighFreqFactor(h.model.rope_high_freq_factor);
  m.setRopeOriginalMaxPositions(h.model.rope_original_max_positions);
  m.setQkvBias(h.model.qkv_bias);
  m.setQkNorm(h.model.qk_norm);
  m.setMaxPositions(h.model.max_positions);
  m.setSlidingWindow(h.model.sliding_window);
  auto kinds = m.initLayerKinds(static_cast<unsigned>(h.model.layer_kinds.size()));
  for (unsigned i = 0; i < kinds.size(); ++i) kinds.set(i, static_cast<uint8_t>(h.model.layer_kinds[i]));
  const MambaConfig& mamba = h.model.mamba;
  m.setMambaHeadsCount(mamba.heads_count);
  m.setMambaHeadDim(mamba.head_dim);
  m.setMambaGroupsCount(mamba.groups_count);
  m.setMambaStateSize(mamba.state_size);
  m.setMambaConvKernel(mamba.conv_kernel);
  m.setMambaConvBias(mamba.conv_bias);
  m.setMambaDtMin(mamba.dt_min);
  m.setMambaDtMax(mamba.dt_max);
  m.setPartialRotaryDim(h.model.partial_rotary_dim);
  auto w = out.initWeights();
  if (h.weights.kind == WeightSource::Kind::kSeed) {
    w.getSource().setSeed(h.weights.seed);
  } else {
    w.getSource().setDirectory(h.weights.directory);
  }
  w.setDigest(h.weights_digest);
  w.setDigestForm(encode_digest_form(h.weights_digest_form));
  auto e = out.initExecutor();
  e.setMaxBatchRows(h.executor.max_batch_rows);
  e.setContextLength(h.executor.context_length);
  e.setPageSize(h.executor.page_size);
  e.setPagesCount(h.executor.pages_count);
  e.setVerifyWidth(h.executor.verify_width);
  e.setPrefillChunkTokens(h.executor.prefill_chunk_tokens);
  e.setHostPagesCount(h.executor.host_pages_count);
  e.setMambaSlotsCount(h.executor.mamba_slots_count);
  out.setCaptureLogits(header_records_logits(h));
  out.setWantLogprobs(h.executor_options.want_logprobs);
  out.setTopLogitsCount(h.top_logits_count);
  out.setBackend(h.backend);
  out.setDeterminismMode(h.determinism_mode);
  out.setIndexStride(h.index_stride);
  out.setDrafter(h.drafter);
  out.setForeignExecutor(h.foreign_executor);
  out.setStepClock(h.step_clock);
  out.setDeviceTimer(h.device_timer);
  out.setTpDegree(h.tp_degree);
  out.setMambaStateDigests(h.mamba_state_digests);
  out.setActivationDigests(h.activation_digests);
  out.setNcclVersion(h.nccl_version);
  out.setNcclAlgo(h.nccl_algo);
  out.setNcclProto(h.nccl_proto);
  auto mi = out.initMachine();
  mi.setCpuName(h.machine.cpu_name);
  mi.setGpuName(h.machine.gpu_name);
  mi.setSmCount(h.machine.sm_count);
  mi.setDriverVersion(h.machine.driver_version);
  mi.setCudaVersion(h.machine.cuda_version);
  mi.setCublasVersion(h.machine.cublas_version);
}

void decode(schema::Header::Reader in, TraceHeader& out) {
  out.format_version = in.getFormatVersion();
  out.build_id = text(in.getBuildId());
  const auto m = in.getModel();
  out.model.name = text(m.getName());
  out.model.hidden_size = m.getHiddenSize();
  out.model.layers_count = m.getLayersCount();
  out.model.query_heads_count = m.getQueryHeadsCount();
  out.model.kv_heads_count = m.getKvHeadsCount();
  out.model.head_dim = m.getHeadDim();
  out.model.ffn_size = m.getFfnSize();
  out.model.vocab_size = m.getVocabSize();
  out.model.rope_theta = m.getRopeTheta();
  out.model.rms_eps = m.getRmsEps();
  out.model.tied_embeddings = m.getTiedEmbeddings();
  out.model.family = family_named(text(m.getFamily()));
  out.model.rope_type = rope_type_named(text(m.getRopeType()));
  out.model.rope_factor = m.getRopeFactor();
  out.model.rope_low_freq_factor = m.getRopeLowFreqFactor();
  out.model.rope_high_freq_factor = m.getRopeHighFreqFactor();
  out.model.rope_original_max_positions = m.getRopeOriginalMaxPositions();
  out.model.qkv_bias = m.getQkvBias();
  out.model.qk_norm = m.getQkNorm();
  out.model.max_positions = m.getMaxPositions();
  out.model.sliding_window = m.getSlidingWindow();
  out.model.layer_kinds.clear();
  for (const uint8_t kind : m.getLayerKinds()) out.model.layer_kinds.push_back(static_cast<LayerKind>(kind));
  MambaConfig& mamba = out.model.mamba;
  mamba.heads_count = m.getMambaHeadsCount();
  mamba.head_dim = m.getMambaHeadDim();
  mamba.groups_count = m.getMambaGroupsCount();
  mamba.state_size = m.getMambaStateSize();
  mamba.conv_kernel = m.getMambaConvKernel();
  mamba.conv_bias = m.getMambaConvBias();
  mamba.dt_min = m.getMambaDtMin();
  mamba.dt_max = m.getMambaDtMax();
  out.model.partial_rotary_dim = m.getPartialRotaryDim();
  const auto w = in.getWeights();
  switch (w.getSource().which()) {
    case schema::Weights::Source::SEED:
      out.weights = WeightSource{.kind = WeightSource::Kind::kSeed, .seed = w.getSource().getSeed()};
      break;
    case schema::Weights::Source::DIRECTORY:
      out.weights = WeightSource{.kind = WeightSource::Kind::kDirectory,
                                 .directory = text(w.getSource().getDirectory())};
      break;
    default:
      throw Error(fmt::format("weights.source holds an unknown union member {}",
                              static_cast<int>(w.getSource().which())));
  }
  out.weights_digest = w.getDigest();
  out.weights_digest_form = weights_digest_form_of(w.getDigestForm());
  const auto e = in.getExecutor();
  out.executor.max_batch_rows = e.getMaxBatchRows();
  out.executor.context_length = e.getContextLength();
  out.executor.page_size = e.getPageSize();
  out.executor.pages_count = e.getPagesCount();
  out.executor.verify_width = e.getVerifyWidth();
  out.executor.prefill_chunk_tokens = e.getPrefillChunkTokens();
  out.executor.host_pages_count = e.getHostPagesCount();
  out.executor.mamba_slots_count = e.getMambaSlotsCount();
  // What the recording executor computed in its steps; it never captured whole logits rows.
  out.executor_options.record = in.getCaptureLogits();
  out.executor_options.capture_logits = false;
  out.executor_options.want_logprobs = in.getWantLogprobs();
  out.top_logits_count = in.getTopLogitsCount();
  out.executor_options.top_logits_count = out.executor_options.record ? out.top_logits_count : 0;
  out.backend = text(in.getBackend());
  out.determinism_mode = text(in.getDeterminismMode());
  out.index_stride = in.getIndexStride();
  // Traces from before drafters carry no name: they ran without one.
  out.drafter = in.hasDrafter() ? text(in.getDrafter()) : std::string(kNoDrafterName);
  out.foreign_executor = text(in.getForeignExecutor());
  out.step_clock = text(in.getStepClock());
  out.device_timer = text(in.getDeviceTimer());
  out.tp_degree = in.getTpDegree();
  out.mamba_state_digests = in.getMambaStateDigests();
  out.activation_digests = in.getActivationDigests();
  out.nccl_version = in.getNcclVersion();
  out.nccl_algo = text(in.getNcclAlgo());
  out.nccl_proto = text(in.getNcclProto());
  const auto mi = in.getMachine();
  out.machine.cpu_name = text(mi.getCpuName());
  out.machine.gpu_name = text(mi.getGpuName());
  out.machine.sm_count = mi.getSmCount();
  out.machine.driver_version = text(mi.getDriverVersion());
  out.machine.cuda_version = text(mi.getCudaVersion());
  out.machine.cublas_version = text(mi.getCublasVersion());
}

void encode(const StepInputRecord& record, schema::StepInput::Builder out) {
  out.setStep(record.step);
  auto rows = out.initRows(static_cast<unsigned>(record.op.rows.size()));
  for (unsigned i = 0; i < rows.size(); ++i) encode_row(record.op.rows[i], rows[i]);
  fill_list(out.initPrefillTokenIds(static_cast<unsigned>(record.op.prefill_token_ids.size())),
            record.op.prefill_token_ids);
  auto cache_ops = out.initCacheOps(static_cast<unsigned>(record.cache_ops.size()));
  for (unsigned i = 0; i < cache_ops.size(); ++i) {
    const CacheOp& c = record.cache_ops[i];
    cache_ops[i].setKind(c.kind == CacheOpKind::kSwapOut ? schema::CacheOpKind::SWAP_OUT
                                                         : schema::CacheOpKind::SWAP_IN);
    fill_list(cache_ops[i].initDevicePages(static_cast<unsigned>(c.device_pages.size())), c.device_pages);
    fill_list(cache_ops[i].initHostPages(static_cast<unsigned>(c.host_pages.size())), c.host_pages);
    cache_ops[i].setStateSlot(c.state_slot);
  }
  const StepFaults& f = record.faults;
  if (f.empty()) return;
  auto faults = out.initFaults();
  fill_list(faults.initPoisonedRows(static_cast<unsigned>(f.poisoned_rows.size())), f.poisoned_rows);
  faults.setPoisonValue(f.poison_value);
  auto forced_rows = faults.initForcedRows(static_cast<unsigned>(f.forced_outputs.size()));
  auto forced_ids = faults.initForcedIds(static_cast<unsigned>(f.forced_outputs.size()));
  for (unsigned i = 0; i < forced_rows.size(); ++i) {
    forced_rows.set(i, f.forced_outputs[i].first);
    forced_ids.set(i, f.forced_outputs[i].second);
  }
}

void decode(schema::StepInput::Reader in, StepInputRecord& out) {
  out.step = in.getStep();
  const auto rows = in.getRows();
  out.op.rows.resize(rows.size());
  for (unsigned i = 0; i < rows.size(); ++i) decode_row(rows[i], i, out.op.rows[i]);
  copy_list(in.getPrefillTokenIds(), out.op.prefill_token_ids);
  const auto cache_ops = in.getCacheOps();
  out.cache_ops.resize(cache_ops.size());
  for (unsigned i = 0; i < cache_ops.size(); ++i) {
    CacheOp& c = out.cache_ops[i];
    c.kind = cache_ops[i].getKind() == schema::CacheOpKind::SWAP_OUT ? CacheOpKind::kSwapOut
                                                                      : CacheOpKind::kSwapIn;
    copy_list(cache_ops[i].getDevicePages(), c.device_pages);
    copy_list(cache_ops[i].getHostPages(), c.host_pages);
    c.state_slot = cache_ops[i].getStateSlot();
  }
  out.faults = StepFaults{};
  if (!in.hasFaults()) return;
  const auto f = in.getFaults();
  copy_list(f.getPoisonedRows(), out.faults.poisoned_rows);
  out.faults.poison_value = f.getPoisonValue();
  const auto forced_rows = f.getForcedRows();
  const auto forced_ids = f.getForcedIds();
  LS_REQUIRE(forced_rows.size() == forced_ids.size(), "faults: {} forced rows but {} forced ids",
             forced_rows.size(), forced_ids.size());
  for (unsigned i = 0; i < forced_rows.size(); ++i) {
    out.faults.forced_outputs.emplace_back(forced_rows[i], forced_ids[i]);
  }
}

void encode(const StepOutputRecord& record, schema::StepOutput::Builder out) {
  const StepResult& r = record.result;
  out.setStep(record.step);
  out.setMode(encode_mode(r.mode));
  out.setPrefillRowsCount(r.prefill_rows_count);
  out.setVerifyWidth(r.verify_width);
  fill_list(out.initTokens(static_cast<unsigned>(r.tokens.size())), r.tokens);
  fill_list(out.initAcceptedLengths(static_cast<unsigned>(r.accepted_lengths.size())),
            r.accepted_lengths);
  fill_list(out.initLogprobs(static_cast<unsigned>(r.logprobs.size())), r.logprobs);
  fill_list(out.initNanFlags(static_cast<unsigned>(r.nan_flags.size())), r.nan_flags);
  fill_list(out.initOovFlags(static_cast<unsigned>(r.oov_flags.size())), r.oov_flags);
  fill_list(out.initLogitsDigests(static_cast<unsigned>(record.logits_digests.size())),
            record.logits_digests);
  fill_list(out.initValidCacheLengths(static_cast<unsigned>(record.valid_cache_lengths.size())),
            record.valid_cache_lengths);
  fill_list(out.initFutureInputDigests(static_cast<unsigned>(record.future_input_digests.size())),
            record.future_input_digests);
  auto top = out.initTopLogits(static_cast<unsigned>(record.top_logits.size()));
  for (unsigned i = 0; i < top.size(); ++i) {
    top[i].setId(record.top_logits[i].id);
    top[i].setLogit(record.top_logits[i].logit);
  }
  fill_list(out.initDrafts(static_cast<unsigned>(record.drafts.size())), record.drafts);
  fill_list(out.initMambaStateDigests(static_cast<unsigned>(record.mamba_state_digests.size())),
            record.mamba_state_digests);
  fill_list(out.initActivationDigests(static_cast<unsigned>(record.activation_digests.size())),
            record.activation_digests);
}

void decode(schema::StepOutput::Reader in, StepOutputRecord& out) {
  StepResult& r = out.result;
  out.step = in.getStep();
  const uint16_t mode = static_cast<uint16_t>(in.getMode());
  LS_REQUIRE(mode <= 3, "mode = {} is not a forward mode", mode);
  r.mode = static_cast<ForwardMode>(mode);
  r.prefill_rows_count = in.getPrefillRowsCount();
  r.verify_width = in.getVerifyWidth();
  copy_list(in.getTokens(), r.tokens);
  copy_list(in.getAcceptedLengths(), r.accepted_lengths);
  copy_list(in.getLogprobs(), r.logprobs);
  copy_list(in.getNanFlags(), r.nan_flags);
  copy_list(in.getOovFlags(), r.oov_flags);
  r.logits.clear();
  copy_list(in.getLogitsDigests(), out.logits_digests);
  copy_list(in.getValidCacheLengths(), out.valid_cache_lengths);
  copy_list(in.getFutureInputDigests(), out.future_input_digests);
  const auto top = in.getTopLogits();
  out.top_logits.resize(top.size());
  for (unsigned i = 0; i < top.size(); ++i) {
    out.top_logits[i] = TopLogit{top[i].getId(), top[i].getLogit()};
  }
  copy_list(in.getDrafts(), out.drafts);
  copy_list(in.getMambaStateDigests(), out.mamba_state_digests);
  copy_list(in.getActivationDigests(), out.activation_digests);
  // The header fixes k; the reader sets it (a record does not repeat it).
  out.top_logits_count = 0;
}

void encode(const TraceEvent& event, schema::Event::Builder out) {
  out.setKind(static_cast<schema::EventKind>(static_cast<uint16_t>(event.kind)));
  out.setRequestId(event.request_id);
  out.setStep(event.step);
  out.setDetail(event.detail);
  out.setHasHistTokenLength(event.hist_token_length.has_value());
  out.setHistTokenLength(event.hist_token_length.value_or(-1));
}

void decode(schema::Event::Reader in, TraceEvent& out) {
  const uint16_t kind = static_cast<uint16_t>(in.getKind());
  LS_REQUIRE(kind <= static_cast<uint16_t>(EventKind::kStepRejected),
             "kind = {} is not an event kind", kind);
  out.kind = static_cast<EventKind>(kind);
  out.request_id = in.getRequestId();
  out.step = in.getStep();
  out.detail = text(in.getDetail());
  out.hist_token_length.reset();
  if (in.getHasHistTokenLength()) out.hist_token_length = in.getHistTokenLength();
}

void encode(const TraceFooter& footer, schema::Footer::Builder out) {
  out.setStepsCount(footer.steps_count);
  out.setOutputsCount(footer.outputs_count);
  out.setEventsCount(footer.events_count);
  out.setIndexStride(footer.index_stride);
  fill_list(out.initStepOffsets(static_cast<unsigned>(footer.step_offsets.size())),
            footer.step_offsets);
}

void decode(schema::Footer::Reader in, TraceFooter& out) {
  out.steps_count = in.getStepsCount();
  out.outputs_count = in.getOutputsCount();
  out.events_count = in.getEventsCount();
  out.index_stride = in.getIndexStride();
  copy_list(in.getStepOffsets(), out.step_offsets);
}

void encode(const StepStatsRecord& s, schema::StepStats::Builder out) {
  out.setStep(s.step);
  out.setSubmitNs(s.submit_ns);
  out.setDoneNs(s.done_ns);
  out.setWaitNs(s.wait_ns);
  out.setDeviceBusyNs(s.device_busy_ns);
  out.setDeviceIdleBeforeNs(s.device_idle_before_ns);
  out.setPagesUsed(s.pages_used);
  out.setPagesFree(s.pages_free);
  out.setPrefixHitTokens(s.prefix_hit_tokens);
  out.setQueueLength(s.queue_length);
  out.setRunningCount(s.running_count);
}

void decode(schema::StepStats::Reader in, StepStatsRecord& out) {
  out = StepStatsRecord{.step = in.getStep(),
                        .submit_ns = in.getSubmitNs(),
                        .done_ns = in.getDoneNs(),
                        .wait_ns = in.getWaitNs(),
                        .device_busy_ns = in.getDeviceBusyNs(),
                        .device_idle_before_ns = in.getDeviceIdleBeforeNs(),
                        .pages_used = in.getPagesUsed(),
                        .pages_free = in.getPagesFree(),
                        .prefix_hit_tokens = in.getPrefixHitTokens(),
                        .queue_length = in.getQueueLength(),
                        .running_count = in.getRunningCount()};
}

}  // namespace ls::trace::codec
