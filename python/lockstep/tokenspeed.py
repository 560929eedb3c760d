"""A TokenSpeed-shaped front for lockstep's executor: an engine written against the seed's
ModelExecutor (execute_forward_op(forward_op, sampling_params_list) -> ModelExecutionResult, then
result.sync()) drives lockstep unchanged, overlap loop included:

    executor = lockstep.tokenspeed.ModelExecutor(model="tiny")
    result_k = executor.execute_forward_op(op_k, params_k)     # dispatch k
    result_k_minus_1.sync()                                    # then commit k - 1

The conversion of the op (seed field names, neutral values for absent ones) and every check are
lockstep's (lockstep.ForwardOp.from_seed); this module only maps the call.
"""

from ._lockstep import Error, Executor, ForwardOp

# Seed arguments of execute_forward_op that lockstep has no counterpart for: accepted only at the
# value that means "not used", so that nothing an engine passes is silently dropped.
_NEUTRAL_ARGUMENTS = {
    "dp_global_num_tokens": None,
    "dp_global_bs": None,
    "dp_all_decode_or_idle": False,
    "dp_all_extend": False,
    "grammar_inputs": None,
    "multimodal_context": None,
}

# FlatForwardOp's second names of two recurrent-state arrays (seed spec §2): lockstep reads the
# first name of each pair, so the second is accepted only when it holds the same slots.
_ALIAS_ARRAYS = {
    "mamba_working_indices": "mamba_pool_indices",
    "mamba_track_pool_indices": "mamba_checkpoint_dst_indices",
}


def _check_aliases(forward_op):
    for alias, name in _ALIAS_ARRAYS.items():
        given = getattr(forward_op, alias, None)
        if given is None:
            continue
        read = getattr(forward_op, name, None)
        read = [-1] * len(given) if read is None else [int(v) for v in read]
        if [int(v) for v in given] != read:
            raise Error(f"execute_forward_op: forward_op.{alias} = {list(given)} differs from "
                        f"forward_op.{name} = {read}, which is the array lockstep reads")


# Sampling attributes of the seed's SamplingParams that lockstep's sampler does not implement:
# refused unless at the value that leaves the distribution unchanged.
_NEUTRAL_SAMPLING = {
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "min_new_tokens": 0,
    "logit_bias": None,
    "json_schema": None,
    "regex": None,
}


def _check_sampling(params_list):
    for i, params in enumerate(params_list):
        for name, neutral in _NEUTRAL_SAMPLING.items():
            value = params.get(name, neutral) if isinstance(params, dict) else getattr(params, name, neutral)
            if value != neutral and not (neutral is None and not value):
                raise Error(f"execute_forward_op: sampling_params_list[{i}].{name} = {value!r} is not "
                            "supported by lockstep's sampler")


class ModelExecutor:
    """execute_forward_op(forward_op, sampling_params_list) over a lockstep.Executor.

    Construct it with Executor keyword arguments, or around an Executor (`executor=`)."""

    def __init__(self, executor=None, **executor_kwargs):
        if executor is not None and executor_kwargs:
            raise Error("ModelExecutor: pass an Executor or Executor arguments, not both "
                        f"(got {sorted(executor_kwargs)})")
        self.executor = executor if executor is not None else Executor(**executor_kwargs)

    def execute_forward_op(self, forward_op, sampling_params_list, capture_next_input_ids=False,
                           **seed_arguments):
        for name, value in seed_arguments.items():
            if name not in _NEUTRAL_ARGUMENTS:
                raise Error(f"execute_forward_op: unknown argument '{name}'")
            if value != _NEUTRAL_ARGUMENTS[name]:
                raise Error(f"execute_forward_op: {name}={value!r} is not supported by lockstep's "
                            f"executor (only {_NEUTRAL_ARGUMENTS[name]!r})")
        if capture_next_input_ids and not self.executor.captures_next_input_ids:
            raise Error("execute_forward_op: capture_next_input_ids needs an Executor built with "
                        "capture_next_input_ids=True (its steps then complete before the next one)")
        _check_aliases(forward_op)
        if isinstance(forward_op, ForwardOp):
            if sampling_params_list:
                raise Error("execute_forward_op: a lockstep.ForwardOp carries its sampling_params; "
                            "pass sampling_params_list=[] or a seed-shaped op")
            op = forward_op
        else:
            _check_sampling(sampling_params_list)
            op = ForwardOp.from_seed(forward_op, list(sampling_params_list))
        return self.executor.submit(op)
