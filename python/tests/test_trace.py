"""lockstep.TraceWriter (a foreign executor's steps in lockstep's format) checked and replayed by
the C++ CLI, and lockstep.open_trace over a simulator trace compared with `lockstep trace
inspect`."""

import re

import pytest

import lockstep
from conftest import SOURCE_DIR, run_cli

HEADER = {"executor": "toy-engine 0.1", "model": "tiny", "max_batch_rows": 4, "context_length": 64,
          "pages_count": 32, "backend": "cpu"}


def prefill_op(request_id, prompt):
    return lockstep.ForwardOp(request_ids=[request_id], request_pool_indices=[1], input_lengths=[len(prompt)],
                              extend_prefix_lens=[0], input_ids=prompt, occupied_pages=[[1, 2]],
                              begins=[0], sizes=[2])


def decode_op(request_id):
    return lockstep.ForwardOp(request_ids=[request_id], request_pool_indices=[1], input_lengths=[1],
                              sampling_params=[None])


def record_foreign(path, header=HEADER, skip_at_step=None, steps=5, model="tiny", wrong_token_at_step=None):
    """The 'foreign executor' is lockstep's own, run here step by step; what the trace holds is
    what the engine reports: the op, the tokens, lengths, flags and each row's KV length. With
    `skip_at_step`, the engine reports a KV length one token past what it committed there; with
    `wrong_token_at_step`, a token other than the one it computed."""
    ex = lockstep.Executor(model=model, max_batch_rows=4, context_length=64, pages_count=32)
    tokens = []
    with lockstep.TraceWriter(path, header) as writer:
        writer.write_event("arrive", 1)
        for step in range(steps):
            op = prefill_op(1, [3, 1, 4, 1, 5]) if step == 0 else decode_op(1)
            out = ex.step(op)
            vcl = ex.read_state([1])["valid_cache_lengths"]
            if step == skip_at_step:
                vcl = vcl + 1
            emitted = out.output_tokens.copy()
            if step == wrong_token_at_step:
                emitted[0] = (int(emitted[0]) + 1) % 512
            assert writer.write_step(op, {"output_tokens": emitted,
                                          "output_lengths": out.output_lengths,
                                          "output_nan_flags": out.output_nan_flags,
                                          "valid_cache_lengths": vcl}) == step
            tokens += out.output_tokens.tolist()
        writer.write_event("finish", 1, detail="length")
    return tokens


def test_check_names_the_planted_vcl_skip(lockstep_bin, tmp_path):
    path = tmp_path / "skips.trace"
    record_foreign(path, skip_at_step=2)
    done = run_cli(lockstep_bin, "check", path, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "VIOLATION: step 2 row 0 (request 1): valid_cache_length (valid_cache_lengths[0]): 8, " \
           "expected previous vcl 6 + accepted 1 = 7" in done.stdout, done.stdout


def test_clean_foreign_trace_checks_and_replays_teacher_forced(lockstep_bin, tmp_path):
    path = tmp_path / "clean.trace"
    record_foreign(path)
    done = run_cli(lockstep_bin, "check", path)
    assert "checked 5 steps" in done.stdout and "every invariant holds" in done.stdout
    inspect = run_cli(lockstep_bin, "trace", "inspect", path).stdout
    assert "outputs from a foreign executor: toy-engine 0.1" in inspect
    replayed = run_cli(lockstep_bin, "replay", path, "--mode", "teacher-forced", "-q").stdout
    assert "recorded by a foreign executor: toy-engine 0.1" in replayed
    assert "agreement: 5/5 tokens (100.00%)" in replayed, replayed


def test_teacher_forced_replay_of_a_disagreeing_trace_exits_1(lockstep_bin, tmp_path):
    """Exit status 1 is a finding (here: a divergence), 0 agreement, 2 unusable input."""
    path = tmp_path / "disagrees.trace"
    record_foreign(path, wrong_token_at_step=3)
    done = run_cli(lockstep_bin, "replay", path, "--mode", "teacher-forced", "-q", check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    # Step 3's recorded token is not the engine's; step 4 reads it back (teacher forcing feeds the
    # recorded tokens) while the engine had read its own: two of five disagree.
    assert "agreement: 3/5 tokens (60.00%)" in done.stdout and "step 3: 0/1 tokens equal" in done.stdout, done.stdout


def test_exact_replay_refuses_a_foreign_trace(lockstep_bin, tmp_path):
    path = tmp_path / "foreign.trace"
    record_foreign(path, steps=2)
    done = run_cli(lockstep_bin, "replay", path, "-q", check=False)
    assert done.returncode == 2
    assert "foreign executor (toy-engine 0.1)" in done.stderr and "teacher-forced" in done.stderr


def test_teacher_forced_replay_on_a_model_directory(lockstep_bin, tmp_path):
    """A foreign engine that ran a Hugging Face checkpoint records no weight digest; `replay
    --model DIR` re-executes on that directory."""
    model_dir = SOURCE_DIR / "tests" / "fixtures" / "hf" / "llama3"
    path = tmp_path / "hf.trace"
    header = dict(HEADER, model=str(model_dir))
    record_foreign(path, header=header, steps=3, model=str(model_dir))
    assert lockstep.open_trace(path).header.weights_digest == 0
    replayed = run_cli(lockstep_bin, "replay", path, "--mode", "teacher-forced", "--model", model_dir, "-q").stdout
    assert "no weight digest recorded" in replayed and "agreement: 3/3 tokens (100.00%)" in replayed, replayed


def test_a_foreign_trace_carries_a_lockstep_digest_with_its_form(lockstep_bin, tmp_path):
    """An engine that copies a lockstep trace's weight digest into its own trace copies the digest's
    form with it: replay then checks the weights in that form, and refuses them under another."""
    own = tmp_path / "own.trace"
    ex = lockstep.Executor(model="tiny", max_batch_rows=2)
    ex.record(own)
    ex.stop_recording()
    recorded = lockstep.open_trace(own).header
    assert recorded.weights_digest_form == "blocks" and recorded.weights_digest != 0
    digest = {"weights_digest": recorded.weights_digest,
              "weights_digest_form": recorded.weights_digest_form}
    path = tmp_path / "digest.trace"
    record_foreign(path, header=dict(HEADER, **digest), steps=2)
    header = lockstep.open_trace(path).header
    assert header.weights_digest == recorded.weights_digest
    assert header.weights_digest_form == "blocks"
    replayed = run_cli(lockstep_bin, "replay", path, "--mode", "teacher-forced", "-q").stdout
    assert "agreement: 2/2 tokens (100.00%)" in replayed, replayed
    wrong = tmp_path / "wrong-form.trace"
    record_foreign(wrong, header={**HEADER, **digest, "weights_digest_form": "stream"}, steps=2)
    done = run_cli(lockstep_bin, "replay", wrong, "--mode", "teacher-forced", "-q", check=False)
    assert done.returncode == 2 and "(stream form)" in done.stderr, done.stderr


def test_writer_refuses_a_digest_without_its_form(tmp_path):
    with pytest.raises(lockstep.Error, match="weights_digest needs weights_digest_form"):
        lockstep.TraceWriter(tmp_path / "a.trace", dict(HEADER, weights_digest=5))
    with pytest.raises(lockstep.Error, match="weights_digest_form is given without weights_digest"):
        lockstep.TraceWriter(tmp_path / "b.trace", dict(HEADER, weights_digest_form="blocks"))
    with pytest.raises(lockstep.Error, match="weights_digest_form 'merkle' is neither"):
        lockstep.TraceWriter(tmp_path / "c.trace",
                             dict(HEADER, weights_digest=5, weights_digest_form="merkle"))


def test_writer_refuses_bad_records(tmp_path):
    with pytest.raises(lockstep.Error, match="executor"):
        lockstep.TraceWriter(tmp_path / "a.trace", {"model": "tiny"})
    with pytest.raises(lockstep.Error, match="max_rows"):
        lockstep.TraceWriter(tmp_path / "b.trace", dict(HEADER, max_rows=3))
    writer = lockstep.TraceWriter(tmp_path / "c.trace", HEADER)
    op = prefill_op(1, [3, 1, 4])
    with pytest.raises(lockstep.Error, match="valid_cache_lengths"):
        writer.write_step(op, {"output_tokens": [7], "output_lengths": [1]})
    with pytest.raises(lockstep.Error, match="tokens"):
        writer.write_step(op, {"output_tokens": [7, 8], "output_lengths": [1], "valid_cache_lengths": [3]})
    with pytest.raises(lockstep.Error, match=r"request_pool_indices\[0\]"):
        bad = lockstep.ForwardOp(request_ids=[1], request_pool_indices=[9], input_lengths=[1],
                                 extend_prefix_lens=[0], input_ids=[2])
        writer.write_step(bad, {"output_tokens": [7], "output_lengths": [1], "valid_cache_lengths": [1]})
    with pytest.raises(lockstep.Error, match="unknown kind"):
        writer.write_event("teleport", 1)
    writer.close()


def row_summary(op, row):
    """`lockstep trace inspect --steps`'s notation of one row, from the record's seed fields."""
    d = op.to_dict()
    ne = op.num_extends()
    kind = "P" if row < ne else "D"
    text = f"{d['request_ids'][row]}:{kind}@{d['request_pool_indices'][row]}"
    if row < ne:
        text += f"[{d['extend_prefix_lens'][row]}+{d['input_lengths'][row]}/{d['prefill_lengths'][row]}]"
    return text


def test_open_trace_over_a_simulator_trace(lockstep_bin, tmp_path):
    path = tmp_path / "sim.trace"
    run_cli(lockstep_bin, "sim", "--seed", "3", "--record", path, "--no-twin")
    trace = lockstep.open_trace(path)
    assert trace.header.model["name"] == "tiny" and trace.header.foreign_executor is None
    records = list(trace)
    kinds = [r.kind for r in records]
    inspect = run_cli(lockstep_bin, "trace", "inspect", path, "--steps", "0:1000").stdout
    counts = re.search(r"records (\d+): (\d+) step inputs, (\d+) step outputs, (\d+) events", inspect)
    assert counts, inspect
    total, inputs, outputs, events = map(int, counts.groups())
    assert len(records) + 1 == total  # the header is not iterated
    assert (kinds.count("step_input"), kinds.count("step_output"), kinds.count("event")) == (inputs, outputs, events)
    assert kinds[-1] == "footer" and records[-1].steps_count == inputs
    # Every step line of the inspect table, rebuilt from the Python records.
    steps_in_table = re.findall(r"^step +(\d+) (IDLE|EXTEND|MIXED|DECODE) +(\d+) rows +(.*)$", inspect, re.M)
    by_step = {r.step: r for r in records if r.kind == "step_input"}
    assert len(steps_in_table) == inputs
    for step, mode, rows, summary in steps_in_table:
        op = by_step[int(step)].op
        assert (op.mode, op.batch_size) == (mode, int(rows))
        # One part per row, then marks such as "+faults".
        parts = summary.split()[:op.batch_size]
        assert [row_summary(op, i) for i in range(op.batch_size)] == parts
    out = next(r for r in records if r.kind == "step_output")
    d = out.to_dict()
    assert set(d) >= {"output_tokens", "output_lengths", "output_nan_flags", "valid_cache_lengths"}
    assert isinstance(d["output_tokens"], list)
    assert trace.truncation is None


def test_cache_ops_carry_the_state_slot_of_a_hybrid_swap(lockstep_bin, tmp_path):
    # Seed 14 of the hybrid world with every fault site on retracts by swap: each cache op carries
    # the working slot whose state travels with its pages; the tiny model's swaps carry none.
    path = tmp_path / "hybrid.trace"
    run_cli(lockstep_bin, "sim", "--model", "tiny-hybrid", "--seed", "14", "--faults", "all",
            "--record", path, "--no-twin")
    ops = [c for r in lockstep.open_trace(path) if r.kind == "step_input" for c in r.cache_ops]
    assert {c["kind"] for c in ops} == {"swap_out", "swap_in"}
    assert all(0 <= c["state_slot"] and c["host_pages"] for c in ops), ops
    fixture = SOURCE_DIR / "tests/fixtures/trace/format3-tiny-swap-no-state-slot.trace"
    old = [c for r in lockstep.open_trace(fixture) if r.kind == "step_input" for c in r.cache_ops]
    assert old and all(c["state_slot"] == -1 for c in old), old


def test_open_trace_reports_corruption_with_the_offset(lockstep_bin, tmp_path):
    path = tmp_path / "sim.trace"
    run_cli(lockstep_bin, "sim", "--seed", "3", "--record", path, "--no-twin")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = b"\xff" * 64
    bad = tmp_path / "bad.trace"
    bad.write_bytes(bytes(data))
    with pytest.raises(lockstep.Error, match="offset") as caught:
        for _ in lockstep.open_trace(bad):
            pass
    assert "record" in str(caught.value)
    cut = tmp_path / "cut.trace"
    cut.write_bytes(path.read_bytes()[:middle])
    trace = lockstep.open_trace(cut)
    list(trace)
    assert trace.truncation is not None and "trace ends" in trace.truncation["describe"]


def test_the_module_names_its_build_as_traces_and_the_cli_do(lockstep_bin, tmp_path):
    path = tmp_path / "version.trace"
    record_foreign(path, steps=1)
    assert lockstep.open_trace(path).header.build_id == lockstep.build_id
    assert lockstep.build_id.startswith(f"lockstep {lockstep.__version__} (git ")
    printed = run_cli(lockstep_bin, "--version").stdout
    assert printed.startswith(lockstep.build_id + "; backends: cpu"), printed


def test_a_closed_trace_is_unmapped_and_refuses_to_read_on(tmp_path):
    path = tmp_path / "closed.trace"
    record_foreign(path, steps=2)

    def mapped():
        with open("/proc/self/maps") as maps:
            return str(path) in maps.read()

    with lockstep.open_trace(path) as trace:
        assert mapped() and not trace.closed
        first = next(trace)
    assert trace.closed and not mapped()
    assert first.kind == "event" and trace.header.model["name"] == "tiny"
    with pytest.raises(lockstep.Error, match="the trace is closed"):
        next(trace)
    trace.close()
