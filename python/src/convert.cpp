#include "bindings.h"

#include "core/check.h"
#include "core/model/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <limits>

namespace ls::py_bindings {

namespace {

std::string type_name(py::handle value) { return Py_TYPE(value.ptr())->tp_name; }

// An int-like Python value as a long long; refuses bools and floats (a 2.5 or a True is a bug in
// the caller, never an index) and anything past the long long range.
long long to_long_long(py::handle value, const std::string& field) {
  PyObject* p = value.ptr();
  const std::string name = type_name(value);
  LS_REQUIRE(!PyBool_Check(p) && !PyFloat_Check(p) && name != "numpy.bool_" && name != "numpy.bool" &&
                 PyIndex_Check(p),
             "{}: expected an integer, got {} ({})", field, name,
             py::str(value).cast<std::string>());
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(p));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  LS_REQUIRE(overflow == 0, "{}: {} does not fit a 64-bit integer", field,
             py::str(index).cast<std::string>());
  return v;
}

template <typename Convert>
auto to_list(py::handle value, const std::string& field, Convert convert) {
  using T = decltype(convert(value, field));
  LS_REQUIRE(!PyUnicode_Check(value.ptr()) && !PyBytes_Check(value.ptr()) &&
                 py::hasattr(value, "__iter__"),
             "{}: expected a sequence (list, tuple or numpy array), got {}", field, type_name(value));
  std::vector<T> out;
  if (py::hasattr(value, "__len__")) out.reserve(py::len(value));
  size_t i = 0;
  for (py::handle item : value) {
    out.push_back(convert(item, fmt::format("{}[{}]", field, i)));
    ++i;
  }
  return out;
}

}  // namespace

int64_t to_int64(py::handle value, const std::string& field) { return to_long_long(value, field); }

int32_t to_int32(py::handle value, const std::string& field) {
  const long long v = to_long_long(value, field);
  LS_REQUIRE(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
             "{}: {} does not fit a 32-bit integer", field, v);
  return static_cast<int32_t>(v);
}

uint64_t to_uint64(py::handle value, const std::string& field) {
  to_long_long(value, field);  // the type check; the range check below covers 2^63..2^64
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  LS_REQUIRE(PyObject_RichCompareBool(index.ptr(), py::int_(0).ptr(), Py_GE) == 1,
             "{}: {} is negative (expected an unsigned 64-bit integer)", field,
             py::str(index).cast<std::string>());
  const unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw Error(fmt::format("{}: {} does not fit an unsigned 64-bit integer", field,
                            py::str(index).cast<std::string>()));
  }
  return v;
}

float to_float(py::handle value, const std::string& field) {
  PyObject* p = value.ptr();
  LS_REQUIRE(!PyBool_Check(p) && (PyFloat_Check(p) || PyIndex_Check(p) || py::hasattr(value, "__float__")),
             "{}: expected a number, got {}", field, type_name(value));
  const double v = PyFloat_AsDouble(p);
  if (PyErr_Occurred()) throw py::error_already_set();
  LS_REQUIRE(!std::isfinite(v) || std::fabs(v) <= std::numeric_limits<float>::max(),
             "{}: {} does not fit a 32-bit float", field, v);
  return static_cast<float>(v);
}

bool to_bool(py::handle value, const std::string& field) {
  const std::string name = type_name(value);
  LS_REQUIRE(PyBool_Check(value.ptr()) || name == "numpy.bool_" || name == "numpy.bool",
             "{}: expected True or False, got {}", field, name);
  return PyObject_IsTrue(value.ptr()) == 1;
}

std::string to_string_value(py::handle value, const std::string& field) {
  if (PyUnicode_Check(value.ptr())) return value.cast<std::string>();
  LS_REQUIRE(py::hasattr(value, "__fspath__"), "{}: expected a string, got {}", field,
             type_name(value));
  return py::str(value.attr("__fspath__")()).cast<std::string>();
}

std::vector<int32_t> to_int32_list(py::handle value, const std::string& field) {
  return to_list(value, field, to_int32);
}
std::vector<uint64_t> to_uint64_list(py::handle value, const std::string& field) {
  return to_list(value, field, to_uint64);
}
std::vector<float> to_float_list(py::handle value, const std::string& field) {
  return to_list(value, field, to_float);
}
std::vector<uint8_t> to_flag_list(py::handle value, const std::string& field) {
  return to_list(value, field, [](py::handle v, const std::string& f) -> uint8_t {
    const std::string name = type_name(v);
    if (PyBool_Check(v.ptr()) || name == "numpy.bool_" || name == "numpy.bool") {
      return PyObject_IsTrue(v.ptr()) == 1 ? 1 : 0;
    }
    const long long x = to_long_long(v, f);
    LS_REQUIRE(x == 0 || x == 1, "{}: a flag must be 0 or 1, got {}", f, x);
    return static_cast<uint8_t>(x);
  });
}

Fields fields_from_kwargs(const py::dict& kwargs, const std::vector<std::string>& known,
                          const std::string& where) {
  Fields out;
  for (auto [key, value] : kwargs) {
    const std::string name = py::str(key).cast<std::string>();
    LS_REQUIRE(std::find(known.begin(), known.end(), name) != known.end(),
               "{}: unknown argument '{}' (known: {})", where, name, fmt::join(known, ", "));
    out.emplace(name, py::reinterpret_borrow<py::object>(value));
  }
  return out;
}

Fields fields_from_object(py::handle object, const std::vector<std::string>& known) {
  if (py::isinstance<py::dict>(object)) {
    return fields_from_kwargs(py::reinterpret_borrow<py::dict>(object), known, "dict");
  }
  Fields out;
  for (const std::string& name : known) {
    if (!py::hasattr(object, name.c_str())) continue;
    out.emplace(name, object.attr(name.c_str()));
  }
  return out;
}

std::optional<py::object> field(const Fields& fields, const std::string& name) {
  const auto it = fields.find(name);
  if (it == fields.end() || it->second.is_none()) return std::nullopt;
  return it->second;
}

SamplingParams sampling_from_python(py::handle value, const std::string& where) {
  if (py::isinstance<SamplingParams>(value)) return value.cast<SamplingParams>();
  static const std::vector<std::string> names = {"temperature", "top_k", "top_p", "min_p", "seed"};
  const Fields f = fields_from_object(value, names);
  SamplingParams s;
  if (auto v = field(f, "temperature")) s.temperature = to_float(*v, where + ".temperature");
  if (auto v = field(f, "top_k")) s.top_k = to_int32(*v, where + ".top_k");
  if (auto v = field(f, "top_p")) s.top_p = to_float(*v, where + ".top_p");
  if (auto v = field(f, "min_p")) s.min_p = to_float(*v, where + ".min_p");
  if (auto v = field(f, "seed")) s.seed = to_uint64(*v, where + ".seed");
  if (const auto refused = s.refusal()) {
    throw Error(fmt::format("{}.{}: {}", where, refused->first, refused->second));
  }
  return s;
}

const std::vector<std::string>& executor_limit_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const LimitField& limit : kLimitFields) n.emplace_back(limit.name);
    return n;
  }();
  return names;
}

ExecutorConfig executor_config_from_fields(Fields& f, const std::string& where) {
  ExecutorConfig c;
  // The keywords are core/limits.h's table: the names, the members and (in validate()) the ranges.
  for (const LimitField& limit : kLimitFields) {
    const std::string name(limit.name);
    if (auto v = field(f, name)) {
      const int64_t value = to_int64(*v, fmt::format("{}: {}", where, name));  // checked, then narrowed
      const std::optional<std::string> error = limit_error(limit, value);
      LS_REQUIRE(!error, "{}: {}", where, *error);
      c.*limit.member = static_cast<int32_t>(value);
    }
    f.erase(name);
  }
  c.validate();
  return c;
}

py::dict executor_config_to_dict(const ExecutorConfig& c) {
  py::dict d;
  for (const LimitField& limit : kLimitFields) d[py::str(std::string(limit.name))] = c.*limit.member;
  return d;
}

py::dict model_config_to_dict(const ModelConfig& m) {
  py::dict d;
  d["name"] = m.name;
  d["hidden_size"] = m.hidden_size;
  d["layers_count"] = m.layers_count;
  d["query_heads_count"] = m.query_heads_count;
  d["kv_heads_count"] = m.kv_heads_count;
  d["head_dim"] = m.head_dim;
  d["ffn_size"] = m.ffn_size;
  d["vocab_size"] = m.vocab_size;
  d["rope_theta"] = m.rope_theta;
  d["rms_eps"] = m.rms_eps;
  d["tied_embeddings"] = m.tied_embeddings;
  d["family"] = std::string(to_string(m.family));
  d["rope_type"] = std::string(to_string(m.rope_type));
  d["rope_factor"] = m.rope_factor;
  d["rope_low_freq_factor"] = m.rope_low_freq_factor;
  d["rope_high_freq_factor"] = m.rope_high_freq_factor;
  d["rope_original_max_positions"] = m.rope_original_max_positions;
  d["partial_rotary_dim"] = m.partial_rotary_dim;
  d["qkv_bias"] = m.qkv_bias;
  d["qk_norm"] = m.qk_norm;
  d["max_positions"] = m.max_positions;
  d["sliding_window"] = m.sliding_window;
  return d;
}

bool is_model_directory(const std::string& model) { return std::filesystem::is_directory(model); }

}  // namespace ls::py_bindings
