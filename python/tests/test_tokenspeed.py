"""lockstep.tokenspeed.ModelExecutor: the seed's execute_forward_op over lockstep's executor."""

import importlib.util
import json
from types import SimpleNamespace

import pytest

import lockstep
import lockstep.tokenspeed
from conftest import PROMPTS, SOURCE_DIR, cli_generate, read_prompts


class FlatForwardOp(SimpleNamespace):
    def num_extends(self):
        return len(self.extend_prefix_lens)


def greedy():
    return SimpleNamespace(temperature=0.0, top_k=-1, top_p=1.0, min_p=0.0)


def test_retraction_scenario(backend):
    """The seed's test_model_executor_retraction: one MIXED op with a prefill row (extend prefix
    10), a decode row with hist_token_lens = -1 at vcl 3, and a decode row recovering from
    retraction with hist_token_lens = 7: after the reset the rows stand at vcl [10, 3, 7]."""
    model = lockstep.tokenspeed.ModelExecutor(model="tiny", backend=backend, max_batch_rows=4,
                                              context_length=64)
    # Request 11 reaches vcl 3 with a 3-token prefill on pool row 2.
    model.execute_forward_op(FlatForwardOp(
        request_ids=[11], request_pool_indices=[2], input_lengths=[3], prefill_lengths=[3],
        occupied_pages=[[2]], begins=[0], sizes=[1], input_ids=[21, 22, 23],
        extend_prefix_lens=[0], decode_input_ids=[], hist_token_lens=[]), [greedy()]).sync()
    mixed = FlatForwardOp(
        request_ids=[10, 11, 12], request_pool_indices=[1, 2, 3], input_lengths=[4, 1, 1],
        prefill_lengths=[14, 0, 0], occupied_pages=[[1], [], [3]], begins=[0, 0, 0],
        sizes=[1, 0, 1], input_ids=[31, 32, 33, 34], extend_prefix_lens=[10],
        decode_input_ids=[-1, 42], hist_token_lens=[-1, 7])
    result = model.execute_forward_op(mixed, [greedy(), greedy(), greedy()])
    result.sync()
    ex = model.executor
    positions = ex.last_inputs()["positions"][:6].tolist()
    # Each row's first position is its vcl after the reset: 10 (prefill), 3 (kept), 7 (recovered).
    assert [positions[0], positions[4], positions[5]] == [10, 3, 7]
    assert positions[:4] == [10, 11, 12, 13]
    assert ex.last_inputs()["input_ids"][5] == 42  # the recovered row's column 0 is its last token
    assert ex.read_state([1, 2, 3])["valid_cache_lengths"].tolist() == [14, 4, 8]
    assert result.output_lengths.tolist() == [1, 1, 1]
    assert len(result.output_tokens) == 1 + 2 * 1  # [ne sampled][nd x W]


def load_example():
    spec = importlib.util.spec_from_file_location("tokenspeed_overlap", SOURCE_DIR / "examples" / "tokenspeed_overlap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_overlap_loop_generates_what_lockstep_generate_does(backend, lockstep_bin, tmp_path):
    example = load_example()
    specs = example.read_prompts(PROMPTS)
    model = lockstep.tokenspeed.ModelExecutor(model="tiny", backend=backend)
    scheduler, stats = example.run(specs, model)
    got = {r.id: r.tokens for r in scheduler.requests}
    expected = cli_generate(lockstep_bin, tmp_path, read_prompts(), backend)
    assert got == expected
    assert stats["decode_steps"] > 0 and all(r.reason == "length" for r in scheduler.requests)


def test_adapter_refuses_what_it_cannot_honour():
    model = lockstep.tokenspeed.ModelExecutor(model="tiny")
    op = FlatForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[1],
                       extend_prefix_lens=[1], input_ids=[5], mamba_pool_indices=[3])
    with pytest.raises(lockstep.Error, match=r"mamba_working_index 3 .*mamba_pool_indices\[0\]"):
        model.execute_forward_op(op, [greedy()])
    # The seed's second name of the working slots must agree with the first, which lockstep reads.
    alias = FlatForwardOp(**{**vars(op), "mamba_pool_indices": [-1], "mamba_working_indices": [3]})
    with pytest.raises(lockstep.Error, match=r"mamba_working_indices = \[3\] differs from"):
        model.execute_forward_op(alias, [greedy()])
    with pytest.raises(lockstep.Error, match="dp_global_bs"):
        model.execute_forward_op(op, [greedy()], dp_global_bs=[4])
    with pytest.raises(lockstep.Error, match="frequency_penalty"):
        model.execute_forward_op(op, [greedy()], frequency_penalty=0.5)
    with pytest.raises(lockstep.Error, match="capture_next_input_ids"):
        model.execute_forward_op(op, [greedy()], capture_next_input_ids=True)
    with pytest.raises(lockstep.Error, match=r"sampling_params_list\[0\].repetition_penalty"):
        plain = FlatForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[1],
                              extend_prefix_lens=[0], input_ids=[5])
        model.execute_forward_op(plain, [SimpleNamespace(temperature=0.0, repetition_penalty=1.2)])
