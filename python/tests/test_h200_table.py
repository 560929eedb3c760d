"""The README's H200 figures are the saved run's: its decode table is what bench/h200_table.py
prints from the gpu-bench.json of the full run the README names, and issue 14's table quotes the
same run's fractions (the JSON is the harness's own record, written on the H200; the README is
typed from it)."""

import re
import subprocess
import sys

from conftest import SOURCE_DIR

SCRIPT = SOURCE_DIR / "bench" / "h200_table.py"


def h200_section():
    text = (SOURCE_DIR / "README.md").read_text()
    return text.split("### On the H200", 1)[1].split("\n### ", 1)[0]


def named_run(section):
    """The gpu-bench.json of the run the section calls the last full run."""
    match = re.search(r"\*\*The last full run: (\w+)\*\* \([^`]*`bench/results/([\w-]+)-\*`",
                      section)
    assert match, "README's H200 section names no last full run"
    path = SOURCE_DIR / "bench" / "results" / f"{match.group(2)}-gpu-bench.json"
    assert match.group(1) in match.group(2), "the run named is not the one whose files are named"
    assert path.exists(), f"{path} is not saved"
    return path


def script(*args):
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def table_at(section, header_start):
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[first:end]


def test_decode_table_is_the_runs():
    section = h200_section()
    printed = script(named_run(section)).splitlines()
    assert len(printed) > 2
    assert table_at(section, "| shape | batch | context | lockstep |") == printed


def test_issue_14_table_quotes_the_runs_fractions():
    section = h200_section()
    measured = {}
    for line in script(named_run(section), "--targets").splitlines()[1:]:
        name, value = re.fullmatch(r"(.*): (.+) \(target .+\): (?:MET|NOT MET)", line).groups()
        measured[name] = value
    rows = {row.split(" | ")[0].lstrip("| "): row.split(" | ")
            for row in table_at(section, "| line | target |")}
    # The README names each decode line shorter after the first (all at context 1024).
    quoted_as = {"decode llama-1b, batch 1, context 1024": "decode llama-1b, batch 1, context 1024",
                 "decode llama-1b, batch 64, context 1024": "decode llama-1b, batch 64",
                 "decode llama-8b, batch 1, context 1024": "decode llama-8b, batch 1",
                 "decode llama-8b, batch 64, context 1024": "decode llama-8b, batch 64"}
    for line, quoted in quoted_as.items():
        assert rows[quoted][2] == measured[line], line
    prefill = rows["prefill 2048 tokens, llama-8b / llama-1b"][2]
    assert prefill == (f"{measured['prefill 2048 tokens, llama-8b']} / "
                       f"{measured['prefill 2048 tokens, llama-1b']}")
    assert rows["host critical path, running ahead"][2] == measured[
        "host critical path running ahead (the most of any decode row)"]


def test_against_the_run_before_quotes_its_rows():
    """The README's comparison with the run before the last full run quotes their JSON's steps."""
    section = h200_section()
    paragraph = section.split("Against the run before it (", 1)[1].split("\n\n", 1)[0]
    before = re.match(r"(\w+), ", paragraph).group(1)
    [base] = (SOURCE_DIR / "bench" / "results").glob(f"*-h200-{before}*-gpu-bench.json")
    rows, changes = {}, {}
    for line in script(named_run(section), "--against", base).splitlines()[2:]:
        name, batch, context, old, new, change = [c.strip() for c in line.strip("|").split("|")]
        rows[(name, int(batch), int(context))] = (new.removesuffix(" ms"), old.removesuffix(" ms"))
        changes[(name, int(batch), int(context))] = float(change.removesuffix("%"))
    # In the paragraph's order: llama-1b and llama-8b at batch 16, context 1024, then the one
    # shape outside 1.5%.
    quoted = re.findall(r"(\d\.\d{3}) against\s+(\d\.\d{3})", paragraph)
    assert quoted == [rows[("llama-1b", 16, 1024)], rows[("llama-8b", 16, 1024)],
                      rows[("llama-8b", 64, 192)]]
    for key, change in changes.items():  # "the other shapes within 1.5%", as printed
        if key[1] != 16 and key != ("llama-8b", 64, 192):
            assert abs(change) <= 1.5, f"{key}: {change:+.1f}%, not within 1.5%"


def test_bad_input_is_refused_by_name(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{\"shapes\": [")
    done = subprocess.run([sys.executable, str(SCRIPT), str(broken)], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert str(broken) in done.stderr
