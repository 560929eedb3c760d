"""Inputs a new user would try (issue 16), each run through the built `lockstep` binary.

Every number in a prompt, flag or trace is range-checked in its own type before it is narrowed,
so each refusal must exit 2 with a message naming the field and the value exactly as it was
written (not wrapped, truncated or reformatted). Then the exit status of every subcommand: 0 ok,
1 a divergence or broken invariant, 2 unusable input or usage, as the help states once.

usage: python3 cli_inputs.py LOCKSTEP WORKDIR
"""
import json
import os
import subprocess
import sys

LOCKSTEP, WORKDIR = sys.argv[1], sys.argv[2]
U64_MAX = 2**64 - 1
failures = []


def path(name):
    return os.path.join(WORKDIR, name)


def run(*args, timeout=120):
    return subprocess.run([LOCKSTEP, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def expect(what, p, status, *needles, absent=()):
    text = p.stdout + p.stderr
    missing = [n for n in needles if n not in text]
    present = [a for a in absent if a in text]
    if p.returncode != status or missing or present:
        failures.append(f"{what}: exit {p.returncode} (expected {status}); missing {missing}; "
                        f"must not print {present}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}")
    else:
        print(f"ok  {what}: exit {status}")


def write(name, text):
    with open(path(name), "w") as f:
        f.write(text)
    return path(name)


def check_prompt_numbers():
    cases = [  # (the line's extra field as written, the field, the value as written)
        ('"max_new_tokens": 4294967300', "max_new_tokens", "4294967300"),
        ('"max_new_tokens": 4.5', "max_new_tokens", "4.5"),
        ('"max_new_tokens": 1e12', "max_new_tokens", "1e12"),
        ('"top_k": 4294967299', "top_k", "4294967299"),
        ('"id": -5', "id", "-5"),
        ('"id": 1.5', "id", "1.5"),
        ('"seed": -1', "seed", "-1"),
        ('"seed": 18446744073709551616', "seed", "18446744073709551616"),
    ]
    for extra, field, value in cases:
        prompts = write("p.jsonl", '{"prompt": [1, 2], ' + extra + '}\n')
        expect(f"prompt {extra}", run("generate", "--prompts", prompts, "-q"), 2, "p.jsonl:1",
               f"field '{field}'", f"got {value}\n", absent=("-727379968", "18446744073709551611"))
    prompts = write("p.jsonl", '{"id": 1, "id": 2, "prompt": [1, 2]}\n')
    expect("prompt with a duplicated key", run("generate", "--prompts", prompts, "-q"), 2,
           "p.jsonl:1", "key 'id' appears twice")


def check_flags(trace):
    prompts = write("ok.jsonl", '{"prompt": [1, 2], "max_new_tokens": 3}\n')
    cases = [  # (argv, the field, the value as written)
        (["sim", "--seed", "-1"], "--seed", "-1"),
        (["sim", "--seed", "18446744073709551616"], "--seed", "18446744073709551616"),
        (["sim", "--seeds", "1..2..3"], "--seeds", "1..2..3"),
        (["sim", "--requests", "4294967297"], "--requests", "4294967297"),
        (["generate", "--prompts", prompts, "--weights-seed", "-1"], "--weights-seed", "-1"),
        (["generate", "--prompts", prompts, "--max-batch-rows", "5000000000"], "max_batch_rows", "5000000000"),
        (["generate", "--prompts", prompts, "--context-length", "1"], "context_length", "got 1\n"),
        (["generate", "--prompts", prompts, "--verify-width", "1.5"], "verify_width", "1.5"),
        (["generate", "--prompts", prompts, "--determinism", "fast"], "--determinism", "fast"),
        (["sim", "--determinism", "exact"], "--determinism", "exact"),
        (["replay", trace, "--isolate", "999999"], "--isolate", "999999"),
        (["replay", trace, "--isolate", "-1"], "--isolate", "-1"),
        (["replay", trace, "--until", "4.5"], "--until", "4.5"),
        (["report", trace, "--json", path("r.json"), "--points", "4.5"], "--points", "4.5"),
        (["trace", "inspect", trace, "--steps", "5:1"], "--steps", "5:1"),
        (["trace", "inspect", trace, "--steps", "900000:900001"], "--steps", "900000:900001"),
        (["trace", "inspect", trace, "--request", "99999"], "--request", "99999"),
        (["trace", "inspect", trace, "--request", "-3"], "--request", "-3"),
    ]
    for argv, field, value in cases:
        expect(" ".join(map(str, argv)), run(*argv), 2, field, value)


def check_top_seed_terminates():
    # The sweep's loop must end at the top of the 64-bit range (it wrapped and never ended).
    top = f"{U64_MAX}..{U64_MAX}"
    p = run("sim", "--seeds", top, "--no-twin", "--results", path("top.jsonl"), timeout=60)
    expect(f"sim --seeds {top}", p, 0, "seeds")
    seeds = []
    if os.path.exists(path("top.jsonl")):
        with open(path("top.jsonl")) as f:
            seeds = [json.loads(line)["seed"] for line in f]
    if seeds != [U64_MAX]:
        failures.append(f"sim --seeds {top} ran seeds {seeds}")
    expect(f"sim --seed {U64_MAX}", run("sim", "--seed", U64_MAX, "--no-twin"), 0, f"seed {U64_MAX}")


def check_exit_codes(trace, other_trace):
    prompts = write("ok.jsonl", '{"prompt": [1, 2], "max_new_tokens": 3}\n{"prompt": [3], "max_new_tokens": 5}\n')
    help_text = run("--help").stdout
    expect("help states the exit codes", run("--help"), 0, "0 ok", "1 a divergence or a broken invariant",
           "2 unusable input or usage")
    if help_text.count("Exit status") != 1:
        failures.append("the top-level help must state the exit codes once")
    run("sim", "--seeds", "1..2", "--no-twin", "--results", path("two.jsonl"))
    for command in (["generate", "--prompts", prompts], ["sim"], ["replay", trace], ["report", trace],
                    ["check", trace], ["trace", "inspect", trace], ["trace", "diff", trace, trace],
                    ["sweep", "merge", path("two.jsonl")]):
        name = " ".join(command[:2] if command[0] in ("trace", "sweep") else command[:1])
        expect(name + " --no-such-flag", run(*command, "--no-such-flag"), 2, "--no-such-flag")
        expect(name + " --help", run(*command, "--help"), 0, "Exit status", "2 unusable input or usage")
    expect("lockstep with no subcommand", run(), 2, "subcommand")
    # generate: 0; 2 for a missing prompt file.
    p = run("generate", "--prompts", prompts)
    expect("generate", p, 0, "generate: 2 requests, 8 tokens")
    emitted = sum(len(json.loads(line)["tokens"]) for line in p.stdout.splitlines())
    if emitted != 8:
        failures.append(f"generate emitted {emitted} tokens, expected 3 + 5 = 8")
    expect("generate --prompts missing", run("generate", "--prompts", path("missing.jsonl")), 2, "missing.jsonl")
    # sim: 0 (a seed that passes).
    expect("sim --seed 3", run("sim", "--seed", 3), 0, "checkers: all passed")
    # replay: 0 identical; 2 an unusable trace.
    expect("replay", run("replay", trace, "-q"), 0, "IDENTICAL")
    junk = write("junk.trace", "this is not a trace")
    expect("replay junk", run("replay", junk, "-q"), 2, "unusable trace")
    # check: 0; 2 for a corrupt trace (not 1: that is a broken invariant).
    expect("check", run("check", trace), 0, "every invariant holds")
    expect("check junk", run("check", junk), 2, "unusable trace")
    with open(trace, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0x10
    damaged = path("damaged.trace")
    with open(damaged, "wb") as f:
        f.write(data)
    expect("check of a damaged record", run("check", damaged), 2, "unusable trace")
    # report: 0; 2.
    expect("report", run("report", trace, "--json", path("r.json")), 0, "report of")
    expect("report junk", run("report", junk, "--json", path("r.json")), 2, "junk.trace")
    # trace inspect: 0; 2. trace diff: 0 same, 1 different, 2 unusable.
    expect("trace inspect", run("trace", "inspect", trace, "--steps", "0:3"), 0, "step      1 EXTEND")
    expect("trace inspect junk", run("trace", "inspect", junk), 2, "junk.trace")
    expect("trace diff same", run("trace", "diff", trace, trace), 0, "no difference")
    expect("trace diff different", run("trace", "diff", trace, other_trace), 1, "first difference")
    expect("trace diff junk", run("trace", "diff", trace, junk), 2, "junk.trace")
    # sweep merge: 0 passed; 1 a failing seed; 2 a malformed or duplicated-key line.
    expect("sweep merge", run("sweep", "merge", path("two.jsonl"), "-o", path("m.jsonl")), 0, "2 passed")
    with open(path("two.jsonl")) as f:
        first = json.loads(f.readline())
    failing = dict(first, verdict="fail", failures=[{"checker": "c", "step": 1, "detail": "d"}])
    write("fail.jsonl", json.dumps(failing) + "\n")
    expect("sweep merge failing", run("sweep", "merge", path("fail.jsonl"), "-o", path("m.jsonl")), 1, "1 failed")
    write("dup.jsonl", json.dumps(first)[:-1] + ', "seed": 9}\n')
    expect("sweep merge duplicated key", run("sweep", "merge", path("dup.jsonl"), "-o", path("m.jsonl")), 2,
           "dup.jsonl:1", "key 'seed' appears twice")


def check_teacher_forced_faults():
    # Recorded with every fault site (oov-sample forces emitted tokens the device never reads
    # back): teacher forcing on the CPU must agree on every token, as exact replay does.
    for seed in (2, 7):
        faulted = path(f"faults-{seed}.trace")
        expect(f"sim --seed {seed} --faults all --record", run("sim", "--seed", seed, "--faults", "all",
                                                                "--record", faulted, "--no-twin"), 0)
        expect(f"replay teacher-forced seed {seed}", run("replay", faulted, "--mode", "teacher-forced", "-q"), 0,
               "(100.00%)")


def main():
    os.makedirs(WORKDIR, exist_ok=True)
    trace, other = path("seed-7.trace"), path("seed-8.trace")
    for seed, name in ((7, trace), (8, other)):
        p = run("sim", "--seed", seed, "--record", name, "--no-twin")
        if p.returncode != 0:
            sys.exit(f"sim --seed {seed} --record failed: {p.stdout}{p.stderr}")
    check_prompt_numbers()
    check_flags(trace)
    check_top_seed_terminates()
    check_exit_codes(trace, other)
    check_teacher_forced_faults()
    if failures:
        sys.exit("\n\n".join(failures))
    print("every input refused as written, every subcommand's exit status as documented")


main()
