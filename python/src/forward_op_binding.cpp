// lockstep.ForwardOp and lockstep.SamplingParams: the seed's FlatForwardOp field names over
// ls::ForwardOp. Shapes (how the seed's flat arrays split into rows) are checked here; every rule
// of the op itself is ls::validate_forward_op's, run when the op is submitted.
#include "bindings.h"

#include "core/check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

namespace ls::py_bindings {

const std::vector<std::string>& forward_op_field_names() {
  static const std::vector<std::string> names = {
      "request_ids",  "request_pool_indices", "input_lengths",      "prefill_lengths",
      "occupied_pages", "begins",             "sizes",              "input_ids",
      "extend_prefix_lens", "decode_input_ids", "hist_token_lens",  "sampling_params",
      "mamba_pool_indices", "mamba_checkpoint_dst_indices", "mamba_cow_src_indices",
      "mamba_branching_seqlens"};
  return names;
}

namespace {

// A per-row array of the seed: [bs] entries, or absent (every row takes `neutral`).
std::vector<int32_t> row_array(const Fields& f, const std::string& name, size_t count,
                               int32_t neutral, const std::string& shape) {
  const auto v = field(f, name);
  if (!v) return std::vector<int32_t>(count, neutral);
  std::vector<int32_t> out = to_int32_list(*v, name);
  LS_REQUIRE(out.size() == count, "ForwardOp: {} holds {} entries, expected {} ({})", name,
             out.size(), count, shape);
  return out;
}

// occupied_pages[i][begins[i] : begins[i] + sizes[i]] is the slice written at column begins[i]
// (seed spec §2); the slice must lie inside the row's page list.
void read_refresh(const Fields& f, std::vector<OpRow>& rows) {
  const size_t bs = rows.size();
  const std::vector<int32_t> begins = row_array(f, "begins", bs, 0, "one per row");
  const std::vector<int32_t> sizes = row_array(f, "sizes", bs, 0, "one per row");
  std::vector<std::vector<int32_t>> pages(bs);
  if (const auto v = field(f, "occupied_pages")) {
    LS_REQUIRE(py::len(*v) == bs, "ForwardOp: occupied_pages holds {} rows, expected {} (one per row)",
               py::len(*v), bs);
    size_t i = 0;
    for (py::handle row : *v) {
      pages[i] = to_int32_list(row, fmt::format("occupied_pages[{}]", i));
      ++i;
    }
  }
  for (size_t i = 0; i < bs; ++i) {
    LS_REQUIRE(sizes[i] >= 0, "ForwardOp: sizes[{}] = {} is negative", i, sizes[i]);
    LS_REQUIRE(begins[i] >= 0, "ForwardOp: begins[{}] = {} is negative", i, begins[i]);
    const int64_t end = int64_t{begins[i]} + sizes[i];
    LS_REQUIRE(sizes[i] == 0 || end <= static_cast<int64_t>(pages[i].size()),
               "ForwardOp: begins[{}] + sizes[{}] = {} runs past occupied_pages[{}] ({} pages)", i,
               i, end, i, pages[i].size());
    rows[i].refresh.begin = begins[i];
    if (sizes[i] > 0) {
      rows[i].refresh.pages.assign(pages[i].begin() + begins[i], pages[i].begin() + end);
    }
  }
}

// The recurrent-state slots, [bs] each, −1 (none) where absent: the seed's Python names
// (spec §2: mamba_pool_indices is its mamba_working_indices). Their rules are
// ls::ForwardOpValidator's (a working slot on every row of a model with Mamba layers, ...).
void read_mamba(const Fields& f, std::vector<OpRow>& rows) {
  const size_t bs = rows.size();
  const std::vector<int32_t> working = row_array(f, "mamba_pool_indices", bs, -1, "one per row");
  const std::vector<int32_t> checkpoint = row_array(f, "mamba_checkpoint_dst_indices", bs, -1, "one per row");
  const std::vector<int32_t> cow_src = row_array(f, "mamba_cow_src_indices", bs, -1, "one per row");
  const std::vector<int32_t> branching = row_array(f, "mamba_branching_seqlens", bs, -1, "one per row");
  for (size_t i = 0; i < bs; ++i) {
    rows[i].mamba_working = working[i];
    rows[i].mamba_checkpoint_dst = checkpoint[i];
    rows[i].mamba_cow_src = cow_src[i];
    rows[i].mamba_branching_seqlen = branching[i];
  }
}

// sampling_params: absent → default parameters on every row (the seed's neutral value); given →
// [bs] entries, each None (the row keeps what its pool row holds) or parameters.
void read_sampling(const Fields& f, std::vector<OpRow>& rows) {
  const auto v = field(f, "sampling_params");
  if (!v) {
    for (OpRow& row : rows) row.sampling = SamplingParams{};
    return;
  }
  LS_REQUIRE(py::len(*v) == rows.size(), "ForwardOp: sampling_params holds {} entries, expected {} (one per row)",
             py::len(*v), rows.size());
  size_t i = 0;
  for (py::handle item : *v) {
    if (!item.is_none()) rows[i].sampling = sampling_from_python(item, fmt::format("sampling_params[{}]", i));
    ++i;
  }
}

}  // namespace

ForwardOp forward_op_from_fields(const Fields& f) {
  ForwardOp op;
  std::vector<uint64_t> ids;
  if (const auto v = field(f, "request_ids")) ids = to_uint64_list(*v, "request_ids");
  const size_t bs = ids.size();
  std::vector<int32_t> prefix;
  if (const auto v = field(f, "extend_prefix_lens")) prefix = to_int32_list(*v, "extend_prefix_lens");
  const size_t ne = prefix.size();
  LS_REQUIRE(ne <= bs, "ForwardOp: extend_prefix_lens holds {} entries (the prefill rows) but there are only {} rows",
             ne, bs);
  const size_t nd = bs - ne;
  const std::vector<int32_t> pool = row_array(f, "request_pool_indices", bs, -1, "one per row");
  LS_REQUIRE(bs == 0 || field(f, "request_pool_indices"), "ForwardOp: request_pool_indices is required when there are rows");
  const std::vector<int32_t> lengths = row_array(f, "input_lengths", bs, -1, "one per row");
  LS_REQUIRE(bs == 0 || field(f, "input_lengths"), "ForwardOp: input_lengths is required when there are rows");
  std::vector<int32_t> prompt(bs, 0);
  if (const auto v = field(f, "prefill_lengths")) {
    const std::vector<int32_t> given = to_int32_list(*v, "prefill_lengths");
    LS_REQUIRE(given.size() == bs || given.size() == ne,
               "ForwardOp: prefill_lengths holds {} entries, expected {} (one per row) or {} (one per prefill row)",
               given.size(), bs, ne);
    for (size_t i = ne; i < given.size(); ++i) {
      LS_REQUIRE(given[i] == 0,
                 "ForwardOp: prefill_lengths[{}] = {} on a decode row: lockstep's decode rows carry no "
                 "prompt length; pass 0 (or give prefill_lengths for the prefill rows only)",
                 i, given[i]);
    }
    std::copy(given.begin(), given.begin() + static_cast<std::ptrdiff_t>(ne), prompt.begin());
  } else {
    // The neutral value: the chunk is the whole prompt.
    for (size_t i = 0; i < ne; ++i) prompt[i] = prefix[i] + lengths[i];
  }
  const std::vector<int32_t> overrides = row_array(f, "decode_input_ids", nd, -1, "one per decode row");
  const std::vector<int32_t> hist = row_array(f, "hist_token_lens", nd, -1, "one per decode row");
  op.rows.resize(bs);
  for (size_t i = 0; i < bs; ++i) {
    OpRow& row = op.rows[i];
    row.kind = i < ne ? RowKind::kPrefill : RowKind::kDecode;
    row.request_id = ids[i];
    row.pool_row = pool[i];
    row.input_length = lengths[i];
    if (i < ne) {
      row.prefix_length = prefix[i];
      row.prompt_length = prompt[i];
    } else {
      row.decode_override = overrides[i - ne];
      row.hist_token_length = hist[i - ne];
    }
  }
  read_refresh(f, op.rows);
  read_mamba(f, op.rows);
  read_sampling(f, op.rows);
  if (const auto v = field(f, "input_ids")) op.prefill_token_ids = to_int32_list(*v, "input_ids");
  return op;
}

py::dict forward_op_to_dict(const ForwardOp& op) {
  py::list ids, pool, lengths, prompt, pages, begins, sizes, prefix, overrides, hist, sampling;
  py::list working, checkpoint, cow_src, branching;
  for (const OpRow& row : op.rows) {
    ids.append(row.request_id);
    working.append(row.mamba_working);
    checkpoint.append(row.mamba_checkpoint_dst);
    cow_src.append(row.mamba_cow_src);
    branching.append(row.mamba_branching_seqlen);
    pool.append(row.pool_row);
    lengths.append(row.input_length);
    // The seed's begin is both the slice's start in occupied_pages and its table column; the op
    // holds only the slice, so the columns before it read 0 (pages this op does not carry).
    std::vector<int32_t> occupied(static_cast<size_t>(row.refresh.begin), 0);
    occupied.insert(occupied.end(), row.refresh.pages.begin(), row.refresh.pages.end());
    pages.append(py::cast(occupied));
    begins.append(row.refresh.begin);
    sizes.append(row.refresh.pages.size());
    sampling.append(row.sampling ? py::cast(*row.sampling) : py::none());
    if (row.kind == RowKind::kPrefill) {
      prompt.append(row.prompt_length);
      prefix.append(row.prefix_length);
    } else {
      prompt.append(0);
      overrides.append(row.decode_override);
      hist.append(row.hist_token_length);
    }
  }
  py::dict d;
  d["request_ids"] = ids;
  d["request_pool_indices"] = pool;
  d["input_lengths"] = lengths;
  d["prefill_lengths"] = prompt;
  d["occupied_pages"] = pages;
  d["begins"] = begins;
  d["sizes"] = sizes;
  d["input_ids"] = py::cast(op.prefill_token_ids);
  d["extend_prefix_lens"] = prefix;
  d["decode_input_ids"] = overrides;
  d["hist_token_lens"] = hist;
  d["sampling_params"] = sampling;
  d["mamba_pool_indices"] = working;
  d["mamba_checkpoint_dst_indices"] = checkpoint;
  d["mamba_cow_src_indices"] = cow_src;
  d["mamba_branching_seqlens"] = branching;
  return d;
}


namespace {

// The seed's FlatForwardOp name of `at`, with its indices; empty for a field the seed has no name
// for (a row kind: the seed's rows are ordered by their counts).
std::string seed_field_name(const OpFieldAt& at, const ForwardOp& op) {
  const bool row = at.row >= 0 && at.row < op.rows_count();
  const int32_t decode_index = at.row - op.prefill_rows_count();
  const auto per_row = [&](std::string_view name) {
    return row ? fmt::format("{}[{}]", name, at.row) : std::string(name);
  };
  const auto per_decode_row = [&](std::string_view name) {  // decode_input_ids, hist_token_lens
    return row && decode_index >= 0 ? fmt::format("{}[{}]", name, decode_index) : std::string(name);
  };
  switch (at.field) {
    case OpField::kRows: return "request_ids";
    case OpField::kPrefillTokens: return "input_lengths";
    case OpField::kPrefillTokenIds:
      return at.element < 0 ? "input_ids" : fmt::format("input_ids[{}]", at.element);
    case OpField::kKind: return "";
    case OpField::kPoolRow: return per_row("request_pool_indices");
    case OpField::kRequestId: return per_row("request_ids");
    case OpField::kInputLength: return per_row("input_lengths");
    case OpField::kPrefixLength: return per_row("extend_prefix_lens");
    case OpField::kPromptLength: return per_row("prefill_lengths");
    case OpField::kDecodeOverride: return per_decode_row("decode_input_ids");
    case OpField::kHistTokenLength: return per_decode_row("hist_token_lens");
    case OpField::kRefreshBegin: return per_row("begins");
    case OpField::kRefreshPages:  // the seed's occupied_pages are the whole table row
      if (!row || at.element < 0) return per_row("occupied_pages");
      return fmt::format("occupied_pages[{}][{}]", at.row,
                         op.rows[at.row].refresh.begin + at.element);
    case OpField::kSampling:
      return at.part.empty() ? per_row("sampling_params")
                             : fmt::format("{}.{}", per_row("sampling_params"), at.part);
    case OpField::kMambaWorking: return per_row("mamba_pool_indices");
    case OpField::kMambaCheckpointDst: return per_row("mamba_checkpoint_dst_indices");
    case OpField::kMambaCowSrc: return per_row("mamba_cow_src_indices");
    case OpField::kMambaBranchingSeqlen: return per_row("mamba_branching_seqlens");
  }
  return "";
}

}  // namespace

std::string with_seed_field(const Error& error, const ForwardOp& op) {
  const auto* refusal = dynamic_cast<const OpFieldError*>(&error);
  const std::string name = refusal == nullptr ? "" : seed_field_name(refusal->at(), op);
  return name.empty() ? error.what() : fmt::format("{} [ForwardOp field: {}]", error.what(), name);
}

namespace {

SamplingParams make_sampling(const py::kwargs& kwargs) {
  static const std::vector<std::string> names = {"temperature", "top_k", "top_p", "min_p", "seed"};
  fields_from_kwargs(kwargs, names, "SamplingParams");  // refuses unknown names
  return sampling_from_python(kwargs, "SamplingParams");
}

py::dict sampling_to_dict(const SamplingParams& s) {
  py::dict d;
  d["temperature"] = s.temperature;
  d["top_k"] = s.top_k;
  d["top_p"] = s.top_p;
  d["min_p"] = s.min_p;
  d["seed"] = s.seed ? py::cast(*s.seed) : py::none();
  return d;
}

PyForwardOp op_from_seed(py::handle object, py::handle sampling_params_list) {
  Fields f = fields_from_object(object, forward_op_field_names());
  if (!sampling_params_list.is_none()) {
    LS_REQUIRE(!field(f, "sampling_params"),
               "ForwardOp.from_seed: sampling_params given twice (on the op and as sampling_params_list)");
    f["sampling_params"] = py::reinterpret_borrow<py::object>(sampling_params_list);
  }
  return PyForwardOp{forward_op_from_fields(f)};
}

}  // namespace

void bind_forward_op(py::module_& m) {
  py::class_<SamplingParams>(m, "SamplingParams",
                             "Per-request sampling parameters (temperature < 1e-6 or top_k = 1: greedy).")
      .def(py::init(&make_sampling))
      .def_readonly("temperature", &SamplingParams::temperature)
      .def_readonly("top_k", &SamplingParams::top_k)
      .def_readonly("top_p", &SamplingParams::top_p)
      .def_readonly("min_p", &SamplingParams::min_p)
      .def_property_readonly("seed", [](const SamplingParams& s) { return s.seed ? py::cast(*s.seed) : py::none(); })
      .def("to_dict", &sampling_to_dict)
      .def("__eq__", [](const SamplingParams& a, const SamplingParams& b) { return a == b; })
      .def("__repr__", [](const SamplingParams& s) {
        return fmt::format("SamplingParams(temperature={}, top_k={}, top_p={}, min_p={}, seed={})",
                           s.temperature, s.top_k, s.top_p, s.min_p,
                           s.seed ? std::to_string(*s.seed) : "None");
      });

  auto cls = py::class_<PyForwardOp>(m, "ForwardOp",
                                     "One scheduled batch with the seed's FlatForwardOp field names.");
  cls.def(py::init([](const py::kwargs& kwargs) {
            return PyForwardOp{forward_op_from_fields(
                fields_from_kwargs(kwargs, forward_op_field_names(), "ForwardOp"))};
          }))
      .def_static("from_seed", &op_from_seed, py::arg("forward_op"),
                  py::arg("sampling_params_list") = py::none(),
                  "From any object with the seed's FlatForwardOp attributes (absent: neutral).")
      .def("to_dict", [](const PyForwardOp& o) { return forward_op_to_dict(o.op); })
      .def("num_extends", [](const PyForwardOp& o) { return o.op.prefill_rows_count(); })
      .def_property_readonly("mode", [](const PyForwardOp& o) { return std::string(to_string(o.op.mode())); })
      .def_property_readonly("batch_size", [](const PyForwardOp& o) { return o.op.rows_count(); })
      .def("__eq__", [](const PyForwardOp& a, const PyForwardOp& b) { return a.op == b.op; })
      .def("__repr__", [](const PyForwardOp& o) {
        return fmt::format("ForwardOp({}, {} rows, {} prefill tokens)", to_string(o.op.mode()),
                           o.op.rows_count(), o.op.prefill_token_ids.size());
      });
  for (const std::string& name : forward_op_field_names()) {
    // The value is taken out while the dict lives (an item accessor would outlive it).
    cls.def_property_readonly(name.c_str(), [name](const PyForwardOp& o) -> py::object {
      const py::dict d = forward_op_to_dict(o.op);
      return d[name.c_str()];
    });
  }
}

}  // namespace ls::py_bindings
