"""Sharded sweeps (`lockstep sim --shard I/N --results --junit`, `lockstep sweep merge`).

The oracle is the unsharded run: for N = 1, 3, 7 over seeds 1..210 the union of the shards'
JSONL lines equals its lines after sorting, wall time excluded (the one field two honest runs of a
seed may differ in). Then the merged JUnit XML is parsed with xml.etree, and the merge's rules are
checked on lines edited from real ones: duplicates, a failing result over a passing one, a
conflict, a missing shard, malformed lines (exit 2 naming file:line and field), bad shard specs.
The sweeps run with --no-twin: the twin run doubles the cost (~45 s instead of ~24 s on the
2-core machine) and is checked elsewhere (SimSweep.*); what is under test here is that a seed's
line does not depend on the shard that ran it.

usage: python3 cli_sim_shards.py LOCKSTEP WORKDIR
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

LOCKSTEP, WORKDIR = sys.argv[1], sys.argv[2]
SEEDS = range(1, 211)


def run(*args, expect=0):
    p = subprocess.run([LOCKSTEP, *args], capture_output=True, text=True)
    if p.returncode != expect:
        sys.exit(f"lockstep {' '.join(args)}: exit {p.returncode}, expected {expect}\n"
                 f"{p.stdout}\n{p.stderr}")
    return p


def path(name):
    return os.path.join(WORKDIR, name)


def read_lines(name):
    with open(path(name)) as f:
        return [json.loads(line) for line in f.read().splitlines()]


def canonical(obj):
    """A result line without its wall time, keys sorted: what must not depend on sharding."""
    obj = dict(obj)
    wall = obj.pop("wall_seconds")
    assert isinstance(wall, (int, float)) and wall >= 0, f"bad wall_seconds {wall!r}"
    return json.dumps(obj, sort_keys=True)


def sweep(name, *extra):
    run("sim", "--seeds", "1..210", "--no-twin", *extra, "--results", path(name + ".jsonl"),
        "--junit", path(name + ".xml"))
    return read_lines(name + ".jsonl")


def junit_cases(name):
    root = ET.parse(path(name)).getroot()
    return root.findall(".//testcase")


def write(name, objs):
    with open(path(name), "w") as f:
        for o in objs:
            f.write((o if isinstance(o, str) else json.dumps(o)) + "\n")


def check_sharding():
    full = sweep("full")
    assert [o["seed"] for o in full] == list(SEEDS), "the unsharded run must hold seeds 1..210 in order"
    assert all(o["verdict"] == "pass" for o in full), "every seed of 1..210 passes on main"
    assert len({o["fingerprint"] for o in full}) == len(full), "fingerprints must tell seeds apart"
    expected = sorted(canonical(o) for o in full)
    for n in (1, 3, 7):
        union = []
        for i in range(n):
            lines = sweep(f"shard-{n}-{i}", "--shard", f"{i}/{n}")
            # The shard rule, computed here: the seeds whose index seed - 1 is i mod n.
            assert [o["seed"] for o in lines] == [s for s in SEEDS if (s - 1) % n == i], (n, i)
            assert len(junit_cases(f"shard-{n}-{i}.xml")) == len(lines)
            union += lines
        assert sorted(canonical(o) for o in union) == expected, f"N = {n}: shards differ from the unsharded run"
        print(f"N = {n}: the union of {n} shards equals the unsharded run ({len(union)} lines)")
    shards = [path(f"shard-7-{i}.jsonl") for i in range(7)]
    run("sweep", "merge", *shards, "--junit", path("all.xml"), "-o", path("merged.jsonl"),
        "--expect-seeds", "1..210")
    merged = read_lines("merged.jsonl")
    assert [canonical(o) for o in merged] == [canonical(o) for o in full], "merge must give the unsharded run, by seed"
    cases = junit_cases("all.xml")
    assert len(cases) == 210, f"merged JUnit has {len(cases)} test cases"
    assert sorted(c.get("name") for c in cases) == sorted(f"seed {s}" for s in SEEDS)
    assert not ET.parse(path("all.xml")).getroot().findall(".//failure")
    print("merged JUnit: 210 test cases, parsed by xml.etree, no failures")
    return full


def check_merge_rules(full):
    five = next(o for o in full if o["seed"] == 5)
    six = next(o for o in full if o["seed"] == 6)
    again = dict(five, wall_seconds=five["wall_seconds"] + 1.5)
    failing = dict(five, verdict="fail", failures=[{"checker": "planted", "step": 3, "detail": "x <&> y"}])
    other = dict(five, fingerprint="0123456789abcdef", twin_fingerprint="0123456789abcdef")
    write("a.jsonl", [five, six])
    write("dup.jsonl", [again])
    p = run("sweep", "merge", path("a.jsonl"), path("dup.jsonl"), "-o", path("m.jsonl"))
    assert [o["seed"] for o in read_lines("m.jsonl")] == [5, 6] and "kept once" in p.stderr, p.stderr
    for order in (["a.jsonl", "fail.jsonl"], ["fail.jsonl", "a.jsonl"]):
        write("fail.jsonl", [failing])
        p = run("sweep", "merge", *map(path, order), "-o", path("m.jsonl"), "--junit", path("m.xml"), expect=1)
        got = {o["seed"]: o for o in read_lines("m.jsonl")}
        assert got[5]["verdict"] == "fail" and got[5]["failures"] == failing["failures"], got[5]
        assert "wins over" in p.stderr, p.stderr
        failures = ET.parse(path("m.xml")).getroot().findall(".//testcase[@name='seed 5']/failure")
        assert len(failures) == 1 and "x <&> y" in failures[0].get("message"), failures
    write("other.jsonl", [other])
    p = run("sweep", "merge", path("a.jsonl"), path("other.jsonl"), "-o", path("m.jsonl"), expect=1)
    got = {o["seed"]: o for o in read_lines("m.jsonl")}
    assert got[5]["failures"][-1]["checker"] == "sweep-merge" and "fingerprint" in got[5]["failures"][-1]["detail"]
    assert "CONFLICT" in p.stderr, p.stderr
    shards = [path(f"shard-7-{i}.jsonl") for i in range(6)]  # shard 6 never reported
    run("sweep", "merge", *shards, "--expect-seeds", "1..210", "--junit", path("m.xml"), "-o", path("m.jsonl"), expect=1)
    missing = ET.parse(path("m.xml")).getroot().findall(".//failure")
    assert len(junit_cases("m.xml")) == 210 and len(missing) == 30, len(missing)
    print("merge rules: duplicate kept once, failing wins both ways, conflict fails the seed, missing shard fails")


def check_refusals(full):
    five = full[4]
    bad = {
        "verdict": ({k: v for k, v in five.items() if k != "verdict"}, "field 'verdict': missing"),
        "unknown": (dict(five, colour="red"), "field 'colour': unknown field"),
        "fingerprint": (dict(five, fingerprint=12), "field 'fingerprint': expected a string"),
        "wall": (dict(five, wall_seconds=-1), "field 'wall_seconds'"),
        "consistency": (dict(five, verdict="fail"), "field 'verdict': 'fail' with 0 failures"),
        "failure": (dict(five, verdict="fail", failures=[{"checker": "c", "step": 1}]), "field 'failures[0].detail': missing"),
        "json": ("{\"seed\": 5,", "not a JSON line"),
    }
    for name, (line, message) in bad.items():
        write("bad.jsonl", [five, line])
        p = run("sweep", "merge", path("bad.jsonl"), "-o", path("m.jsonl"), expect=2)
        assert f"bad.jsonl:2: " in p.stderr and message in p.stderr, (name, p.stderr)
    for spec, message in (("3/3", "below the count"), ("0/0", "at least 1"), ("1/x", "expected I/N")):
        p = run("sim", "--seeds", "1..3", "--shard", spec, expect=2)
        assert f"--shard '{spec}'" in p.stderr and message in p.stderr, p.stderr
    run("sim", "--seed", "3", "--shard", "0/2", expect=2)
    run("sim", "--seeds", "1..3", "--results", path("no/such/dir/r.jsonl"), expect=2)
    run("sweep", "merge", path("a.jsonl"), "--expect-seeds", "9..1", expect=2)
    print("refusals: malformed lines name file:line and field; bad shard specs and paths exit 2")


full = check_sharding()
check_merge_rules(full)
check_refusals(full)
