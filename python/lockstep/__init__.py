"""lockstep from Python: drive lockstep's executor, record a foreign executor's steps in lockstep's
trace format, and read traces.

    import lockstep
    ex = lockstep.Executor(model="tiny", backend="cpu", max_batch_rows=4)
    r = ex.step(lockstep.ForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[3],
                                   extend_prefix_lens=[0], input_ids=[5, 6, 7]))
    r.output_tokens   # numpy int32 [ne sampled][nd x W]

Every error the C++ side raises (a malformed op, a limit, a corrupt trace) is a lockstep.Error,
a subclass of ValueError, whose message names the field.
"""

from ._lockstep import (  # noqa: F401
    __version__,
    Error,
    Executor,
    ForwardOp,
    Result,
    SamplingParams,
    TraceWriter,
    build_id,
    cuda_device_available,
    has_cuda,
    model_config,
    model_names,
)
from .records import Event, Footer, Header, Record, StepInput, StepOutput, StepStats, TraceFile, open_trace  # noqa: F401

__all__ = [
    "Error", "Executor", "ForwardOp", "Result", "SamplingParams", "TraceWriter", "open_trace",
    "TraceFile", "Header", "StepInput", "StepOutput", "Event", "Footer", "StepStats", "Record",
    "build_id", "cuda_device_available", "has_cuda", "model_config", "model_names",
]
