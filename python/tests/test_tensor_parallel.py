"""Executor(tp=N): the CPU reference simulating N tensor-parallel ranks (issue 18). Its tokens are
what `lockstep generate --tp N` emits, its logits TP 1's within the tolerance the C++ tests state,
its traces carry the degree, and a degree the model cannot shard is refused by name."""

import numpy as np
import pytest

import lockstep
from conftest import cli_generate, read_prompts, run_cli
from test_forward_op import prefill


def greedy_tokens(ex, spec, steps):
    out = ex.step(lockstep.ForwardOp(**prefill(1, 1, spec["prompt"], [1, 2, 3])))
    tokens, logits = [int(out.output_tokens[0])], [out.logits[0].copy()]
    decode = lockstep.ForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[1],
                                sampling_params=[None])
    for _ in range(steps - 1):
        out = ex.step(decode)
        tokens.append(int(out.output_tokens[0]))
        logits.append(out.logits[0].copy())
    return tokens, np.stack(logits)


def test_tp2_matches_the_cli_and_tp1_within_tolerance(lockstep_bin, tmp_path):
    spec = read_prompts()[0]  # request 1: greedy, 16 new tokens
    expected = cli_generate(lockstep_bin, tmp_path, [spec], "cpu", "--tp", "2")[1]
    tp2 = lockstep.Executor(model="tiny", tp=2, capture_logits=True)
    assert tp2.tp == 2
    tokens2, logits2 = greedy_tokens(tp2, spec, len(expected))
    assert tokens2 == expected
    tokens1, logits1 = greedy_tokens(lockstep.Executor(model="tiny", capture_logits=True), spec,
                                     len(expected))
    assert tokens1 == tokens2
    scale = np.abs(logits1).max(axis=1)
    relative = (np.abs(logits1 - logits2).max(axis=1) / scale).max()
    assert 0 < relative <= 1e-5, relative  # > 0: the ranks' all-reduce really ran


def test_tp_degree_the_model_cannot_shard_is_refused_by_name():
    with pytest.raises(lockstep.Error, match=r"kv heads \(num_key_value_heads\) = 2"):
        lockstep.Executor(model="tiny", tp=4)
    with pytest.raises(lockstep.Error, match=r"must be in \[1, 8\], got 0"):
        lockstep.Executor(model="tiny", tp=0)


def test_a_tp2_recording_carries_the_degree_and_replays_exactly(lockstep_bin, tmp_path):
    path = tmp_path / "tp2.trace"
    ex = lockstep.Executor(model="tiny", tp=2, max_batch_rows=2)
    ex.record(path)
    ex.step(lockstep.ForwardOp(**prefill(5, 1, [1, 2, 3], [1])))
    ex.step(lockstep.ForwardOp())  # IDLE: runs the collectives with no rows
    for _ in range(3):
        ex.step(lockstep.ForwardOp(request_ids=[5], request_pool_indices=[1], input_lengths=[1],
                                   sampling_params=[None]))
    ex.stop_recording()
    assert lockstep.open_trace(path).header.tp_degree == 2
    out = run_cli(lockstep_bin, "replay", path, "-q").stdout
    assert "IDENTICAL" in out and "at TP 2" in out, out
    refused = run_cli(lockstep_bin, "replay", path, "-q", "--tp", "1", check=False)
    assert refused.returncode == 2 and "exact replay refuses --tp 1" in refused.stderr
    forced = run_cli(lockstep_bin, "replay", path, "-q", "--tp", "1", "--mode", "teacher-forced").stdout
    assert "agreement: 4/4 tokens" in forced, forced
