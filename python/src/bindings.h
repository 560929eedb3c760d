// Shared pieces of the `lockstep` Python module: strict conversions from Python values (every
// value that does not fit its field is an ls::Error naming the field, never wrapped or dropped)
// and the conversions of lockstep's plain types to Python objects with the seed's field names.
// These are bindings only: every rule (op validation, limits, sampling ranges) stays in core/.
#pragma once

#include "core/config.h"
#include "core/forward_op.h"
#include "core/sampling_params.h"
#include "core/step_result.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every TU: std::vector and std::optional convert the same everywhere

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ls::py_bindings {

namespace py = pybind11;

// Scalars: a Python int (or anything with __index__ that is not a bool), in the type's range.
int32_t to_int32(py::handle value, const std::string& field);
int64_t to_int64(py::handle value, const std::string& field);
uint64_t to_uint64(py::handle value, const std::string& field);
float to_float(py::handle value, const std::string& field);
bool to_bool(py::handle value, const std::string& field);
std::string to_string_value(py::handle value, const std::string& field);

// Sequences (list, tuple, numpy array, any iterable) of the scalar kinds above.
std::vector<int32_t> to_int32_list(py::handle value, const std::string& field);
std::vector<uint64_t> to_uint64_list(py::handle value, const std::string& field);
std::vector<float> to_float_list(py::handle value, const std::string& field);
std::vector<uint8_t> to_flag_list(py::handle value, const std::string& field);

// Named values as given: keyword arguments, a dict, or the attributes of an object. `known`
// lists the names the caller reads; any other name given is an ls::Error naming it (`where`).
using Fields = std::map<std::string, py::object>;
Fields fields_from_kwargs(const py::dict& kwargs, const std::vector<std::string>& known,
                          const std::string& where);
// The attributes of `object` among `known` (absent ones are simply not given).
Fields fields_from_object(py::handle object, const std::vector<std::string>& known);
std::optional<py::object> field(const Fields& fields, const std::string& name);

// SamplingParams from a lockstep.SamplingParams, a dict, or any object with the attributes
// temperature, top_k, top_p, min_p, seed (absent or None: the default).
SamplingParams sampling_from_python(py::handle value, const std::string& field);

// The seed's FlatForwardOp field names (request_ids, request_pool_indices, input_lengths,
// prefill_lengths, occupied_pages, begins, sizes, input_ids, extend_prefix_lens,
// decode_input_ids, hist_token_lens, and the Python names of its recurrent-state slots:
// mamba_pool_indices, mamba_checkpoint_dst_indices, mamba_cow_src_indices,
// mamba_branching_seqlens) plus sampling_params; a name not given takes its neutral
// value. Shapes are checked here (they are the binding's); everything else by
// ls::validate_forward_op when the op is submitted.
const std::vector<std::string>& forward_op_field_names();
ForwardOp forward_op_from_fields(const Fields& fields);
py::dict forward_op_to_dict(const ForwardOp& op);

// A Python value for ExecutorConfig limits given by name (max_batch_rows, ...); the others
// keep ExecutorConfig's defaults. Removes the names it used from `fields`.
const std::vector<std::string>& executor_limit_names();
ExecutorConfig executor_config_from_fields(Fields& fields, const std::string& where);
py::dict executor_config_to_dict(const ExecutorConfig& config);
py::dict model_config_to_dict(const ModelConfig& config);

// The model a `model=` argument names: a named shape (random weights from `weights_seed`) or a
// Hugging Face directory. `weights_seed` given with a directory is an ls::Error.
bool is_model_directory(const std::string& model);

// An executor error about an op (an OpFieldError) names lockstep's row fields (pool_row,
// hist_token_length, ...); this appends the seed's name of what the caller passed, e.g.
// " [ForwardOp field: hist_token_lens[1]]". The message unchanged for any other error.
std::string with_seed_field(const Error& error, const ForwardOp& op);

// The wrapper every ForwardOp is held in on the Python side.
struct PyForwardOp {
  ForwardOp op;
};

void bind_forward_op(py::module_& m);
void bind_executor(py::module_& m);
void bind_trace(py::module_& m);

}  // namespace ls::py_bindings
