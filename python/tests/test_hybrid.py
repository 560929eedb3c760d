"""A hybrid (Mamba2) model through lockstep.Executor on the CPU reference: each row's working
state slot (mamba_pool_indices), a swap that carries the state with the pages (copy_pages'
state_slot), and the refusals. Expected tokens come from `lockstep generate --model tiny-hybrid`."""

from types import SimpleNamespace

import pytest

import lockstep
import lockstep.tokenspeed
from conftest import cli_generate, read_prompts, run_cli


def hybrid_executor(**limits):
    return lockstep.Executor(model="tiny-hybrid", max_batch_rows=2, mamba_slots_count=4,
                             pages_count=16, host_pages_count=4, **limits)


def prefill(request_id, pool_row, prompt, pages, working):
    return lockstep.ForwardOp(request_ids=[request_id], request_pool_indices=[pool_row],
                              input_lengths=[len(prompt)], extend_prefix_lens=[0], input_ids=prompt,
                              occupied_pages=[pages], begins=[0], sizes=[len(pages)],
                              sampling_params=[lockstep.SamplingParams()],
                              mamba_pool_indices=[working])


def decode(request_id, pool_row, working):
    return lockstep.ForwardOp(request_ids=[request_id], request_pool_indices=[pool_row],
                              input_lengths=[1], sampling_params=[None], mamba_pool_indices=[working])


def decode_tokens(ex, request_id, pool_row, working, count):
    return [ex.step(decode(request_id, pool_row, working)).output_tokens[0] for _ in range(count)]


@pytest.fixture
def request_1(lockstep_bin, tmp_path):
    """Request 1 of examples/prompts.jsonl (greedy) and its tokens from the CLI's serving loop."""
    spec = next(s for s in read_prompts() if s["id"] == 1)
    return spec, cli_generate(lockstep_bin, tmp_path, [spec], "cpu", "--model", "tiny-hybrid")[1]


def test_prefill_and_decode_match_the_cli(request_1):
    spec, expected = request_1
    ex = hybrid_executor()
    # Slot 2: not the slot the CLI's first row uses, so the slot given is the slot read.
    tokens = [ex.step(prefill(1, 1, spec["prompt"], [1], working=2)).output_tokens[0]]
    tokens += decode_tokens(ex, 1, 1, 2, len(expected) - 1)
    assert tokens == expected


def test_swap_round_trip_carries_the_state(request_1):
    spec, expected = request_1
    ex = hybrid_executor()
    tokens = [ex.step(prefill(1, 1, spec["prompt"], [1], working=2)).output_tokens[0]]
    tokens += decode_tokens(ex, 1, 1, 2, 3)
    ex.copy_pages("swap_out", device_pages=[1], host_pages=[0], state_slot=2)
    # Another request's prefill overwrites request 1's KV page and its working state.
    ex.step(prefill(9, 2, list(range(40, 56)), [1], working=2))
    ex.copy_pages("swap_in", device_pages=[1], host_pages=[0], state_slot=2)
    tokens += decode_tokens(ex, 1, 1, 2, len(expected) - len(tokens))
    assert tokens == expected


def test_recorded_swap_carries_the_state_slot_and_replays(lockstep_bin, tmp_path):
    path = tmp_path / "hybrid-swap.trace"
    ex = hybrid_executor()
    ex.record(path)
    ex.step(prefill(1, 1, [17, 204, 33], [1], working=2))
    ex.copy_pages("swap_out", device_pages=[1], host_pages=[0], state_slot=2)
    ex.step(prefill(9, 2, [40, 41, 42, 43], [1], working=2))
    ex.copy_pages("swap_in", device_pages=[1], host_pages=[0], state_slot=2)
    ex.step(decode(1, 1, 2))
    ex.stop_recording()
    inputs = [r for r in lockstep.open_trace(path) if r.kind == "step_input"]
    assert [[c["state_slot"] for c in r.cache_ops] for r in inputs] == [[], [2], [2]]
    assert [r.op.mamba_pool_indices for r in inputs] == [[2], [2], [2]]
    # Exact replay re-runs the cache ops with their state slots and compares every output.
    run_cli(lockstep_bin, "replay", path, "-q")


def test_tokenspeed_adapter_reads_the_working_slots(request_1):
    spec, expected = request_1
    model = lockstep.tokenspeed.ModelExecutor(executor=hybrid_executor())
    op = SimpleNamespace(request_ids=[1], request_pool_indices=[1], input_lengths=[len(spec["prompt"])],
                         extend_prefix_lens=[0], input_ids=spec["prompt"], occupied_pages=[[1]],
                         begins=[0], sizes=[1], mamba_pool_indices=[3], mamba_working_indices=[3])
    greedy = SimpleNamespace(temperature=0.0, top_k=-1, top_p=1.0, min_p=0.0)
    assert model.execute_forward_op(op, [greedy]).output_tokens.tolist() == expected[:1]


def test_fields_default_to_none_and_read_back():
    op = lockstep.ForwardOp(request_ids=[1, 2], request_pool_indices=[1, 2], input_lengths=[1, 1],
                            mamba_pool_indices=[3, 0], mamba_checkpoint_dst_indices=[1, -1])
    assert op.mamba_pool_indices == [3, 0] and op.mamba_checkpoint_dst_indices == [1, -1]
    assert op.mamba_cow_src_indices == [-1, -1] and op.mamba_branching_seqlens == [-1, -1]
    assert op.to_dict()["mamba_pool_indices"] == [3, 0]
    assert decode(1, 1, 0) != decode(1, 1, 1)


def test_refusals():
    tiny = lockstep.Executor(model="tiny", max_batch_rows=2, pages_count=16, host_pages_count=4)
    with pytest.raises(lockstep.Error, match="state_slot 0 but the model has no Mamba layers"):
        tiny.copy_pages("swap_out", device_pages=[3], host_pages=[0], state_slot=0)
    # Core's refusal lists the four slots; the binding names the one given.
    slots = lockstep.Executor(model="tiny", max_batch_rows=2, mamba_slots_count=4)
    with pytest.raises(lockstep.Error, match=r"no Mamba layers.*mamba_cow_src_indices\[0\]"):
        slots.step(lockstep.ForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[1],
                                      extend_prefix_lens=[0], input_ids=[5], mamba_cow_src_indices=[1],
                                      mamba_branching_seqlens=[0]))
    ex = hybrid_executor()
    with pytest.raises(lockstep.Error, match=r"mamba_working_index is -1.*mamba_pool_indices\[0\]"):
        ex.step(prefill(1, 1, [5, 6, 7], [1], working=-1))
    with pytest.raises(lockstep.Error, match=r"mamba_pool_indices\[0\]: 2147483648 does not fit"):
        decode(1, 1, 2**31)
    with pytest.raises(lockstep.Error, match=r"mamba_branching_seqlens holds 2 entries, expected 1"):
        lockstep.ForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[1],
                           mamba_branching_seqlens=[-1, -1])
    with pytest.raises(lockstep.Error, match="copy_pages: state_slot: 4294967296 does not fit"):
        ex.copy_pages("swap_out", device_pages=[1], host_pages=[0], state_slot=2**32)
    with pytest.raises(lockstep.Error, match=r"state_slot 4 is outside \[0, mamba_slots_count = 4\)"):
        ex.copy_pages("swap_out", device_pages=[1], host_pages=[0], state_slot=4)
