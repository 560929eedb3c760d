"""ForwardOp through lockstep.Executor: each mode, its outputs' layout and the state it leaves.
Expected tokens come from `lockstep generate` (the C++ serving loop) on the same requests; lengths,
positions and vcl are computed by hand from the op."""

import numpy as np
import pytest

import lockstep
from conftest import cli_generate, read_prompts


def prefill(request_id, pool_row, prompt, pages, sampling=None, prefix=0):
    return dict(request_ids=[request_id], request_pool_indices=[pool_row], input_lengths=[len(prompt)],
                extend_prefix_lens=[prefix], input_ids=prompt, occupied_pages=[pages],
                begins=[0], sizes=[len(pages)],
                sampling_params=[sampling or lockstep.SamplingParams()])


def sampling_of(spec):
    keys = ("temperature", "top_k", "top_p", "min_p", "seed")
    return lockstep.SamplingParams(**{k: spec[k] for k in keys if k in spec})


def test_extend_decode_mixed_idle(backend, lockstep_bin, tmp_path):
    specs = {s["id"]: s for s in read_prompts()}
    r1, r4 = specs[1], specs[4]
    # CPU: batch-invariant, so the CLI's batching does not matter. CUDA: the CLI runs request 1
    # alone, as the EXTEND and DECODE steps below do; the MIXED step is checked for shape only.
    expected = cli_generate(lockstep_bin, tmp_path, [r1, r4] if backend == "cpu" else [r1], backend)
    # The CLI's limits (B 16, L 512, P 16), so that CUDA runs the same kernels as the CLI did.
    ex = lockstep.Executor(model="tiny", backend=backend)

    extend = lockstep.ForwardOp(**prefill(1, 1, r1["prompt"], [1]))
    assert extend.mode == "EXTEND" and extend.num_extends() == 1
    out = ex.step(extend)
    assert out.mode == "EXTEND"
    assert out.output_tokens.dtype == np.int32 and out.output_tokens.tolist() == [expected[1][0]]
    assert out.output_lengths.tolist() == [1]
    assert out.output_nan_flags.tolist() == [False]
    assert out.output_logprobs is None
    assert ex.read_state([1])["valid_cache_lengths"].tolist() == [8]

    decode = lockstep.ForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[1],
                                sampling_params=[None])
    assert decode.mode == "DECODE"
    out = ex.step(decode)
    assert out.output_tokens.tolist() == [expected[1][1]]
    assert ex.last_inputs()["positions"][0] == 8
    assert ex.read_state([1])["valid_cache_lengths"].tolist() == [9]

    # Prefill rows first: request 4's prompt (3 tokens), then request 1's third token.
    mixed = lockstep.ForwardOp(
        request_ids=[4, 1], request_pool_indices=[2, 1], input_lengths=[3, 1], extend_prefix_lens=[0],
        input_ids=r4["prompt"], occupied_pages=[[2], []], begins=[0, 0], sizes=[1, 0],
        sampling_params=[sampling_of(r4), None])
    assert mixed.mode == "MIXED"
    out = ex.step(mixed)
    assert out.mode == "MIXED" and out.output_lengths.tolist() == [1, 1]
    assert len(out.output_tokens) == 1 + 1 * 1  # [ne sampled][nd x W]
    if backend == "cpu":
        assert out.output_tokens.tolist() == [expected[4][0], expected[1][2]]
    assert ex.last_inputs()["positions"][:4].tolist() == [0, 1, 2, 9]
    assert ex.read_state([2, 1])["valid_cache_lengths"].tolist() == [3, 10]

    idle = lockstep.ForwardOp()
    assert idle.mode == "IDLE" and idle.batch_size == 0
    out = ex.step(idle)
    assert out.mode == "IDLE" and out.output_tokens.tolist() == [] and out.output_lengths.tolist() == []
    assert ex.read_state([2, 1])["valid_cache_lengths"].tolist() == [3, 10]


def test_overlap_submit_then_sync(backend):
    """submit k + 1 before reading k: results come back in order, each with its own tokens."""
    ex = lockstep.Executor(model="tiny", backend=backend, max_batch_rows=2)
    first = ex.step(lockstep.ForwardOp(**prefill(7, 1, [3, 4, 5], [1])))
    decode = lockstep.ForwardOp(request_ids=[7], request_pool_indices=[1], input_lengths=[1],
                                sampling_params=[None])
    a = ex.submit(decode)
    b = ex.submit(decode)
    b.sync()  # syncs a first
    assert a.ready and b.ready
    serial = lockstep.Executor(model="tiny", backend=backend, max_batch_rows=2)
    serial.step(lockstep.ForwardOp(**prefill(7, 1, [3, 4, 5], [1])))
    assert first.output_tokens.size == 1
    assert serial.step(decode).output_tokens.tolist() == a.output_tokens.tolist()
    assert serial.step(decode).output_tokens.tolist() == b.output_tokens.tolist()


def test_captured_logits_pick_the_greedy_token():
    ex = lockstep.Executor(model="tiny", capture_logits=True)
    out = ex.step(lockstep.ForwardOp(**prefill(3, 2, [9, 8, 7, 6], [5])))
    assert out.logits.shape == (1, ex.vocab_size)
    assert int(np.argmax(out.logits[0])) == int(out.output_tokens[0])  # greedy: argmax, lowest id
    assert lockstep.Executor(model="tiny").step(lockstep.ForwardOp()).logits is None


def test_logprobs_and_next_input_ids():
    ex = lockstep.Executor(model="tiny", want_logprobs=True, capture_next_input_ids=True)
    out = ex.step(lockstep.ForwardOp(**prefill(3, 2, [9, 8, 7, 6], [5])))
    assert out.output_logprobs.dtype == np.float32 and out.output_logprobs.shape == (1,)
    assert out.output_logprobs[0] <= 0.0
    # The prefill row's next input (future_input_map, W = 1) is the token it sampled.
    assert out.next_input_ids.tolist() == [[int(out.output_tokens[0])]]


def test_record_and_replay_exactly(lockstep_bin, tmp_path):
    from conftest import run_cli
    path = tmp_path / "own.trace"
    ex = lockstep.Executor(model="tiny", max_batch_rows=2)
    ex.record(path)
    ex.step(lockstep.ForwardOp(**prefill(5, 1, [1, 2, 3], [1])))
    # Rejected by the executor (a request new to pool row 2 with no sampling): recorded as such.
    with pytest.raises(lockstep.Error, match=r"sampling_params\[0\]"):
        ex.step(lockstep.ForwardOp(request_ids=[6], request_pool_indices=[2], input_lengths=[2],
                                   extend_prefix_lens=[0], input_ids=[1, 1], sampling_params=[None]))
    for _ in range(3):
        ex.submit(lockstep.ForwardOp(request_ids=[5], request_pool_indices=[1], input_lengths=[1],
                                     sampling_params=[None]))
    ex.stop_recording()
    out = run_cli(lockstep_bin, "replay", path, "-q").stdout
    assert "IDENTICAL" in out and "4 steps" in out, out
    # The executor digests its weights once: a second recording's header carries the digest the
    # CLI's replay just checked the first one's against.
    again = tmp_path / "again.trace"
    ex.record(again)
    ex.stop_recording()
    digest = lockstep.open_trace(path).header.weights_digest
    assert digest != 0 and lockstep.open_trace(again).header.weights_digest == digest


def test_speculative_layout_and_greedy_equivalence(backend, lockstep_bin, tmp_path):
    """W = 4 with the n-gram drafter: each decode row returns W verify outputs ([ne][nd x W]) and
    accepts a in [1, W]. On the CPU reference the accepted tokens, in order, are W = 1's greedy
    tokens (`lockstep generate`); on CUDA (whose fast mode keeps that promise only in invariant
    mode) they are what `lockstep generate --verify-width 4 --drafter ngram` emits."""
    spec = read_prompts()[0]  # request 1: greedy, 16 new tokens
    extra = () if backend == "cpu" else ("--verify-width", "4", "--drafter", "ngram")
    expected = cli_generate(lockstep_bin, tmp_path, [spec], backend, *extra)[1]
    ex = lockstep.Executor(model="tiny", backend=backend, verify_width=4, drafter="ngram")
    out = ex.step(lockstep.ForwardOp(**prefill(1, 1, spec["prompt"], [1, 2])))
    tokens = out.output_tokens.tolist()
    decode = lockstep.ForwardOp(request_ids=[1], request_pool_indices=[1], input_lengths=[4],
                                sampling_params=[None])
    while len(tokens) < len(expected):
        out = ex.step(decode)
        assert out.output_tokens.shape == (4,)
        a = int(out.output_lengths[0])
        assert 1 <= a <= 4
        assert out.row_tokens(0) == out.output_tokens[:a].tolist()
        tokens += out.row_tokens(0)
    assert tokens[:len(expected)] == expected


def test_numpy_arrays_in():
    as_lists = lockstep.ForwardOp(**prefill(3, 1, [5, 6, 7], [1]))
    as_numpy = lockstep.ForwardOp(request_ids=np.array([3], dtype=np.uint64),
                                  request_pool_indices=np.array([1], dtype=np.int32),
                                  input_lengths=np.array([3]), extend_prefix_lens=np.zeros(1, dtype=np.int64),
                                  input_ids=np.array([5, 6, 7], dtype=np.int32), occupied_pages=np.array([[1]]),
                                  begins=[0], sizes=[1], sampling_params=[lockstep.SamplingParams()])
    assert as_lists == as_numpy
    with pytest.raises(lockstep.Error, match=r"input_ids\[0\]"):
        lockstep.ForwardOp(input_ids=np.array([5.0]))


def test_copy_pages():
    ex = lockstep.Executor(model="tiny", max_batch_rows=2, pages_count=16, host_pages_count=4)
    ex.copy_pages("swap_out", device_pages=[3], host_pages=[0])
    ex.copy_pages("swap_in", device_pages=[4], host_pages=[0])
    with pytest.raises(lockstep.Error, match="host"):
        ex.copy_pages("swap_out", device_pages=[3], host_pages=[9])
    with pytest.raises(lockstep.Error, match="kind"):
        ex.copy_pages("swap_sideways", device_pages=[3], host_pages=[0])


def test_close_finishes_the_steps_and_the_recording_then_refuses(backend, lockstep_bin, tmp_path):
    """`with lockstep.Executor(...)` closes it on the way out: the steps in flight are finished,
    the recording is complete (footer written, it replays), and the executor refuses any later
    call by name; closing again does nothing."""
    from conftest import run_cli
    path = tmp_path / "closed.trace"
    decode = lockstep.ForwardOp(request_ids=[5], request_pool_indices=[1], input_lengths=[1],
                                sampling_params=[None])
    with lockstep.Executor(model="tiny", backend=backend, max_batch_rows=2) as ex:
        assert not ex.closed
        ex.record(path)
        ex.step(lockstep.ForwardOp(**prefill(5, 1, [1, 2, 3], [1])))
        last = ex.submit(decode)
    assert ex.closed and last.ready and last.output_lengths.tolist() == [1]
    assert run_cli(lockstep_bin, "check", path).returncode == 0
    replayed = run_cli(lockstep_bin, "replay", path, "--backend", backend, "-q").stdout
    assert "IDENTICAL" in replayed and "2 steps" in replayed, replayed
    for call in (lambda: ex.submit(decode), lambda: ex.read_state([1]), lambda: ex.record(path)):
        with pytest.raises(lockstep.Error, match="the executor is closed"):
            call()
    ex.close()
    # Not recording: the steps in flight are finished too.
    ex = lockstep.Executor(model="tiny", backend=backend, max_batch_rows=2)
    first = ex.submit(lockstep.ForwardOp(**prefill(5, 1, [1, 2, 3], [1])))
    ex.close()
    assert first.ready and first.output_lengths.tolist() == [1]
