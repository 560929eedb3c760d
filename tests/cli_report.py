"""`lockstep report` rendered in headless Chromium.

A simulated run with faults on, page pressure (a swap retraction and its recovery) and
speculative decoding (W 5, the n-gram drafter) is recorded, replayed (`replay --json`) and
reported. The page must load in Chromium with no console message at all and its script must mark
itself rendered; every figure it shows (each carries data-key="path") must equal the --json
document's value at that path, and every figure of the document must be shown; the charts must
draw one point per series point and the timeline one row per request. Independently of the
report, the simulator's own summary and `trace inspect` give the totals that the report must
agree with (steps, retractions, faults by site, requests by outcome). A replay result edited to
diverge shows its divergence on every chart. Bad input exits 2 naming what is wrong.

usage: python3 cli_report.py LOCKSTEP CHROMIUM WORKDIR
"""
import html.parser
import json
import os
import re
import subprocess
import sys
import tempfile

LOCKSTEP, CHROMIUM, WORKDIR = sys.argv[1:4]
SEED_ARGS = ["sim", "--seed", "7", "--spec", "--faults", "all", "--requests", "80"]
CHART_NAMES = ["rows", "tokens", "latency", "throughput", "pages", "queue", "accept", "ended"]


def path(name):
    return os.path.join(WORKDIR, name)


def run(*args, expect=0):
    p = subprocess.run([LOCKSTEP, *args], capture_output=True, text=True)
    if p.returncode != expect:
        sys.exit(f"lockstep {' '.join(args)}: exit {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}")
    return p


class Dom(html.parser.HTMLParser):
    """The elements of the dumped DOM that the checks read."""

    def __init__(self):
        super().__init__()
        self.figures = {}  # data-key -> text
        self.elements = []  # (tag, attrs)
        self._open_key = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        if "data-key" in a:
            assert a["data-key"] not in self.figures, f"figure {a['data-key']} shown twice"
            self._open_key = a["data-key"]
            self.figures[self._open_key] = ""

    def handle_endtag(self, tag):
        self._open_key = None

    def handle_data(self, data):
        if self._open_key is not None:
            self.figures[self._open_key] += data


def render(page):
    """Chromium's DOM after the page's script ran, and its console output."""
    profile = tempfile.mkdtemp(prefix="lockstep-chromium-")
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run",
                        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom",
                        "file://" + os.path.abspath(page)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, "the page wrote to the console:\n" + "\n".join(console)
    dom = Dom()
    dom.feed(p.stdout)
    status = [a for t, a in dom.elements if a.get("id") == "report-status"]
    assert status and status[0].get("data-report-status") == "rendered", f"the page's script did not finish: {status}"
    return dom


def leaves(obj, prefix):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, f"{prefix}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def same_figure(text, value):
    if value is None:
        return text == "–"
    if isinstance(value, bool):
        return text == ("yes" if value else "no")
    if isinstance(value, int):
        return text == str(value)
    if isinstance(value, float):
        return abs(float(text) - value) <= 1e-5 * max(1.0, abs(value))
    return text == value


def check_figures(dom, report):
    shown = dict(dom.figures)
    sections = ["trace", "totals", "requests", "replay"] + [s for s in ("accept", "step_latency") if report[s]]
    count = 0
    for section in sections:
        for key, value in leaves(report[section], section):
            assert key in shown, f"the page does not show {key} = {value!r}"
            assert same_figure(shown.pop(key), value), f"{key}: page {dom.figures[key]!r}, JSON {value!r}"
            count += 1
    for section in ("accept", "step_latency"):
        if report[section] is None:
            assert shown.pop(section, None) is not None, f"the page says nothing about the missing {section}"
    assert not shown, f"the page shows figures that are not in the JSON: {sorted(shown)}"
    return count


def check_charts(dom, report):
    points = report["series"]["points"]
    assert len(points) > 100, "the run is long enough to draw"
    polylines = [a for t, a in dom.elements if t == "polyline"]
    for a in polylines:
        drawn = len(a["points"].split())
        expected = sum(1 for p in points if p[a["data-series"]] is not None)
        assert drawn == expected, f"{a['data-series']}: {drawn} points drawn, {expected} in the series"
    assert {a["data-series"] for a in polylines} >= {"prefill_tokens", "decode_tokens", "emitted_tokens",
                                                       "kv_pages_max", "accept_rate", "step_us_mean",
                                                       "tokens_per_s", "pages_used_max", "queue_max"}
    bars = [a for t, a in dom.elements if t == "rect" and a.get("data-series") == "recovered_rows"]
    assert len(bars) == len(points)
    markers = [a for t, a in dom.elements if a.get("data-marker") == "retractions"]
    assert len(markers) == sum(1 for p in points if p["retractions"] > 0) > 0
    rows = [a for t, a in dom.elements if t == "g" and a.get("class") == "tl-row"]
    assert len(rows) == len(report["timeline"]["rows"]) == report["timeline"]["requests"]
    charts = {a["data-chart"] for t, a in dom.elements if t == "svg" and "data-chart" in a}
    assert charts == set(CHART_NAMES) | {"timeline"}, charts


def sim_summary(out):
    """The simulator's own figures, printed by `lockstep sim`."""
    m = re.search(r"requests: (\d+) finished, (\d+) aborted by the client, (\d+) numerical errors", out)
    finished, aborted, numerical = map(int, m.groups())
    swap, recompute = map(int, re.search(r"retractions: (\d+) swap, (\d+) recompute", out).groups())
    fired = dict((k, int(v)) for k, v in re.findall(r"([a-z-]+) (\d+)", re.search(r"faults fired: (.*)", out).group(1)))
    return finished, aborted, numerical, swap, recompute, fired


def check_against_simulator(report, sim_out, inspect_out):
    finished, aborted, numerical, swap, recompute, fired = sim_summary(sim_out)
    totals, requests = report["totals"], report["requests"]
    assert swap > 0, "seed 7 with page pressure retracts by swap"
    assert totals["retractions"].get("swap", 0) == swap and totals["retractions"].get("recompute", 0) == recompute
    assert totals["recovered_rows"] >= 1 and report["accept"]["verify_width"] == 5
    # The trace records the world's faults except the planted page pressure (a smaller pool).
    assert totals["faults"] == {k: v for k, v in fired.items() if k != "page-pressure"}, (totals["faults"], fired)
    ended = sum(requests["finished"].values()) + sum(requests["aborted"].values())
    assert ended == finished + aborted + numerical == requests["arrived"] == 80, (requests, finished, aborted, numerical)
    assert requests["finished"].get("numerical_error", 0) + requests["aborted"].get("numerical_error", 0) == numerical
    steps = int(re.search(r"(\d+) complete steps", inspect_out).group(1))
    assert totals["steps"] == steps == report["trace"]["complete_steps"], (totals["steps"], steps)
    # The simulator's clock charges a step 400 us and 2 us per input token (sim/world.cpp), so the
    # step stats (written by the world, read back from the trace) must add up to that over the
    # input records' tokens.
    latency = report["step_latency"]
    assert latency["clock"] == "simulated" and latency["timed_steps"] == steps
    expected_us = 400 * steps + 2 * (totals["prefill_tokens"] + totals["decode_tokens"])
    assert abs(latency["step_us"]["mean"] * steps - expected_us) < 1e-6 * expected_us, (latency, expected_us)
    assert 0 < latency["pages_used_max"] <= report["trace"]["pages"] - 1 and latency["queue_max"] > 0


def check_no_network(page):
    text = open(page).read()
    for pattern in (r"\bsrc\s*=", r"\bhref\s*=", r"url\(", r"https://", r"@import"):
        assert not re.search(pattern, text), f"the page refers to something outside itself: {pattern}"


def main():
    trace, replayed = path("report.trace"), path("report-replay.json")
    sim_out = run(*SEED_ARGS, "--no-twin", "--record", trace).stdout
    # The simulator's clock makes its step stats, and so the whole trace, a function of the seed.
    run(*SEED_ARGS, "--no-twin", "--record", path("again.trace"))
    assert open(trace, "rb").read() == open(path("again.trace"), "rb").read(), "a seed's trace differs run to run"
    run("replay", trace, "--quiet", "--json", replayed)
    inspect_out = run("trace", "inspect", trace).stdout
    run("report", trace, "-o", path("report.html"), "--json", path("report.json"), "--replay-json", replayed)
    report = json.load(open(path("report.json")))
    assert report["replay"]["verdict"] == "identical"
    check_no_network(path("report.html"))
    dom = render(path("report.html"))
    count = check_figures(dom, report)
    check_charts(dom, report)
    check_against_simulator(report, sim_out, inspect_out)
    print(f"page: no console output, {count} figures equal to --json, charts and timeline drawn")

    diverged = json.load(open(replayed))
    step = report["series"]["points"][len(report["series"]["points"]) // 2]["step_first"]
    diverged.update(verdict="diverged", divergence={"step": step, "request_id": 1004, "row": 1, "field": "tokens",
                                                    "expected": "[5]", "actual": "[6]",
                                                    "replay_until": f"lockstep replay {trace} --until {step}"})
    json.dump(diverged, open(path("diverged.json"), "w"))
    run("report", trace, "-o", path("diverged.html"), "--json", path("diverged-report.json"),
        "--replay-json", path("diverged.json"))
    dom = render(path("diverged.html"))
    check_figures(dom, json.load(open(path("diverged-report.json"))))
    marks = [a for t, a in dom.elements if a.get("data-divergence-step") == str(step)]
    assert len(marks) == len(CHART_NAMES), f"the divergence at step {step} is marked on {len(marks)} charts"
    print(f"divergence at step {step}: shown and marked on every chart")

    # A recorded `generate` (the serving loop on the host's steady clock) carries a step's stats
    # for every step: its times in order.
    generated = path("generate.trace")
    prompts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "prompts.jsonl")
    run("generate", "--prompts", prompts, "--record", generated, "-o", path("generate.jsonl"), "-q")
    run("report", generated, "--json", path("generate.json"))
    g = json.load(open(path("generate.json")))
    latency = g["step_latency"]
    assert latency["clock"] == "steady" and latency["device_timer"] == "host-clock", latency
    assert latency["timed_steps"] == g["totals"]["steps"] > 0 and latency["step_us"]["max"] > 0
    times = [p["time_s"] for p in g["series"]["points"] if p.get("time_s") is not None]
    assert times == sorted(times) and g["requests"]["ttft_ms"]["count"] == g["requests"]["arrived"] > 0
    print(f"generate: {latency['timed_steps']} steps timed on the steady clock, step p50 {latency['step_us']['p50']} us")

    other = path("other.trace")
    run("sim", "--seed", "3", "--no-twin", "--record", other)
    p = run("report", other, "--json", path("x.json"), "--replay-json", replayed, expect=2)
    assert "is the replay of another trace" in p.stderr, p.stderr
    json.dump(dict(diverged, colour="red"), open(path("bad.json"), "w"))
    p = run("report", trace, "--json", path("x.json"), "--replay-json", path("bad.json"), expect=2)
    assert "field 'colour': unknown field" in p.stderr, p.stderr
    p = run("report", path("missing.trace"), "--json", path("x.json"), expect=2)
    assert "missing.trace" in p.stderr, p.stderr
    open(path("garbage.trace"), "w").write("not a trace")
    p = run("report", path("garbage.trace"), "--json", path("x.json"), expect=2)
    assert "garbage.trace" in p.stderr, p.stderr
    run("report", trace, expect=2)
    run("report", trace, "--json", path("x.json"), "--points", "3", expect=2)
    run("report", trace, "--json", path("x.json"), "--colour", expect=2)
    print("refusals: another trace's replay, unknown keys, missing and corrupt traces, bad flags exit 2")


main()
