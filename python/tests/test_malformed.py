"""Every malformed field of an op or an argument is a lockstep.Error (a ValueError) that names it,
and a rejected op changes nothing. The field names are the seed's (what the caller passed)."""

import pytest

import lockstep


def base(**overrides):
    """A valid MIXED op: request 1 prefills 3 tokens at pool row 1, request 2 decodes at row 2."""
    fields = dict(request_ids=[1, 2], request_pool_indices=[1, 2], input_lengths=[3, 1],
                  prefill_lengths=[3, 0], extend_prefix_lens=[0], input_ids=[4, 5, 6],
                  occupied_pages=[[1], []], begins=[0, 0], sizes=[1, 0],
                  decode_input_ids=[9], hist_token_lens=[5],
                  sampling_params=[lockstep.SamplingParams(), lockstep.SamplingParams()])
    fields.update(overrides)
    return fields


@pytest.fixture(scope="module")
def ex():
    return lockstep.Executor(model="tiny", max_batch_rows=4, context_length=64, pages_count=32)


CASES = [
    # (what, overrides, the name the error must carry)
    ("duplicate request id", dict(request_ids=[1, 1]), "request_ids[1]"),
    ("negative request id", dict(request_ids=[1, -2]), "request_ids[1]"),
    ("request id count", dict(request_ids=[1, 2, 3]), "request_pool_indices"),
    ("pool row 0 (reserved)", dict(request_pool_indices=[0, 2]), "request_pool_indices[0]"),
    ("pool row past B", dict(request_pool_indices=[1, 5]), "request_pool_indices[1]"),
    ("pool row past int32", dict(request_pool_indices=[1, 2**31]), "request_pool_indices[1]"),
    ("pool row as float", dict(request_pool_indices=[1.0, 2]), "request_pool_indices[0]"),
    ("decode input length != W", dict(input_lengths=[3, 2]), "input_lengths[1]"),
    ("prefill chunk of 0 tokens", dict(input_lengths=[0, 1], input_ids=[]), "input_lengths[0]"),
    ("prompt shorter than chunk", dict(prefill_lengths=[2, 0]), "prefill_lengths[0]"),
    ("prompt length on a decode row", dict(prefill_lengths=[3, 7]), "prefill_lengths[1]"),
    ("page out of range", dict(occupied_pages=[[40], []]), "occupied_pages[0][0]"),
    ("page list past the slice", dict(sizes=[2, 0]), "sizes[0]"),
    ("negative begin", dict(begins=[-1, 0]), "begins[0]"),
    ("token id past V", dict(input_ids=[4, 5, 100000]), "input_ids[2]"),
    ("token count", dict(input_ids=[4, 5]), "input_ids"),
    ("prefix past L", dict(extend_prefix_lens=[62]), "extend_prefix_lens[0]"),
    ("decode override past V", dict(decode_input_ids=[100000]), "decode_input_ids[0]"),
    ("hist_token_lens past L", dict(hist_token_lens=[65]), "hist_token_lens[0]"),
    ("recovery without its last token", dict(decode_input_ids=[-1]), "hist_token_lens[0]"),
    ("hist_token_lens count", dict(hist_token_lens=[5, 5]), "hist_token_lens"),
    ("temperature out of range",
     dict(sampling_params=[lockstep.SamplingParams(), {"temperature": -1.0}]),
     "sampling_params[1].temperature"),
    ("top_p out of range", dict(sampling_params=[{"top_p": 0.0}, None]),
     "sampling_params[0].top_p"),
    ("missing sampling on a new row", dict(sampling_params=[None, None]), "sampling_params[0]"),
    ("state slot on a model without Mamba layers", dict(mamba_pool_indices=[0, -1]), "mamba_pool_indices[0]"),
    ("state slot count", dict(mamba_checkpoint_dst_indices=[-1]), "mamba_checkpoint_dst_indices"),
    ("state slot past int32", dict(mamba_cow_src_indices=[-1, 2**31]), "mamba_cow_src_indices[1]"),
    ("unknown field", dict(shifted_input_ids=[5, 6, -1]), "shifted_input_ids"),
]


@pytest.mark.parametrize("what,overrides,name", CASES, ids=[c[0] for c in CASES])
def test_malformed_field_names_it(ex, what, overrides, name):
    before = ex.read_state([1, 2])["valid_cache_lengths"].tolist()
    with pytest.raises(lockstep.Error) as caught:
        ex.step(lockstep.ForwardOp(**base(**overrides)))
    assert name in str(caught.value), f"{what}: {caught.value}"
    assert isinstance(caught.value, ValueError)
    assert ex.read_state([1, 2])["valid_cache_lengths"].tolist() == before  # nothing ran


def test_the_base_op_is_valid(ex):
    out = ex.step(lockstep.ForwardOp(**base()))
    assert out.output_lengths.tolist() == [1, 1]


@pytest.mark.parametrize("kwargs,name", [
    (dict(model="tiny", max_batch_size=4), "max_batch_size"),
    (dict(model="tiny", max_batch_rows=2**31), "max_batch_rows"),
    (dict(model="tiny", page_size=0), "page_size"),
    (dict(model="tiny", backend="tpu"), "tpu"),
    (dict(model="no-such-shape"), "no-such-shape"),
    (dict(model="tiny", want_logprobs=1), "want_logprobs"),
    (dict(model="tiny", cuda_graphs=False), "cuda_graphs"),
    (dict(model="tiny", drafter="ngram"), "verify_width"),
    (dict(), "model"),
])
def test_executor_arguments(kwargs, name):
    with pytest.raises(lockstep.Error) as caught:
        lockstep.Executor(**kwargs)
    assert name in str(caught.value)


def test_sampling_params_arguments():
    with pytest.raises(lockstep.Error, match="tempreature"):
        lockstep.SamplingParams(tempreature=0.5)
    with pytest.raises(lockstep.Error, match="seed"):
        lockstep.SamplingParams(seed=-1)
    with pytest.raises(lockstep.Error, match="top_k"):
        lockstep.SamplingParams(top_k=0)
