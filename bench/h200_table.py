#!/usr/bin/env python3
"""README's H200 tables from a full run's benchmark JSON (`lockstep_gpu_bench --json`, saved as
bench/results/DATE-h200-COMMIT-gpu-bench.json by scripts/gpu-run.sh):

    python3 bench/h200_table.py bench/results/2026-12-05-h200-94756ddde2e2-gpu-bench.json
    python3 bench/h200_table.py RUN.json --targets   # issue 14's lines against the same run
    python3 bench/h200_table.py RUN.json --against BASE.json  # each decode step against BASE's

The decode table has one row a shape, batch and context, as the README's "On the H200" prints it:
the step with CUDA graphs running ahead, its fractions of the streaming read and the copy
bandwidth measured in the same run, the device's idle time between steps (the host's critical
path) and the host's own time a step, the step and its idle time one step at a time, and the peers
of the same run (a PyTorch decode step in one CUDA graph, HF transformers `generate`). Every
figure is the JSON's, rounded for print; python/tests/test_h200_table.py checks that the README's
tables are this script's output for the run the README names.
"""

import argparse
import json
import sys

HEADER = (
    "| shape | batch | context | lockstep | % of read BW | % of copy BW | device idle | host CPU "
    "| one step at a time (idle) | PyTorch graph | HF `generate` |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)

# Issue 14's decode lines: (shape, batch, context 1024, the least fraction of the read bandwidth).
DECODE_TARGETS = [("llama-1b", 1, 0.80), ("llama-1b", 64, 0.75), ("llama-8b", 1, 0.85),
                  ("llama-8b", 64, 0.80)]
# Its prefill lines: a 2048-token prefill's least fraction of the measured matrix rate.
PREFILL_TARGETS = [("llama-8b", 0.65), ("llama-1b", 0.50)]
HOST_CRITICAL_PATH_US_MAX = 2.0


def percent(fraction):
    return f"{100 * fraction:.1f}%"


def peer_steps(run):
    """(shape, batch, context) → the PyTorch graph's step and HF generate's time a token, in ms."""
    peer = run.get("peer") or {}
    torch = {(p["shape"], p["batch"], p["context"]): p["step_ms_median"]
             for p in peer.get("decode", [])}
    hf = {(p["shape"], p["batch"], p["context"]): p["step_ms"]
          for p in peer.get("hf_generate", [])}
    return torch, hf


def decode_rows(run):
    """Every decode measurement run ahead (pipelined), in the JSON's order."""
    for shape in run["shapes"]:
        for d in shape["decode"]:
            if d["pipelined"]:
                yield shape["shape"], d


def decode_index(run):
    """(shape, batch, context) → that decode measurement, in the JSON's order."""
    return {(name, d["batch"], d["context"]): d for name, d in decode_rows(run)}


def decode_table(run):
    torch, hf = peer_steps(run)
    lines = [HEADER]
    for key, d in decode_index(run).items():
        name = key[0]
        sync = d["sync"]
        cells = [
            name, str(d["batch"]), str(d["context"]), f"{d['step_ms_median']:.3f} ms",
            percent(d["read_bandwidth_fraction"]), percent(d["bandwidth_fraction"]),
            f"{d['host_critical_path_us_median']:.1f} µs", f"{d['host_us_median']:.0f} µs",
            f"{sync['step_ms_median']:.3f} ms ({sync['host_critical_path_us_median']:.1f} µs)",
            f"{torch[key]:.3f} ms" if key in torch else "",
            f"{hf[key]:.2f} ms/token" if key in hf else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison_table(run, base):
    """Each decode row of `run` beside the same (shape, batch, context) of `base`, where it has one:
    both step times and the change (an A/B's builds, or two full runs)."""
    before = decode_index(base)
    lines = [f"| shape | batch | context | {base['commit']} | {run['commit']} | step time |",
             "|---|---|---|---|---|---|"]
    for (name, batch, context), d in decode_index(run).items():
        if (name, batch, context) not in before:
            continue
        old, new = before[(name, batch, context)]["step_ms_median"], d["step_ms_median"]
        lines.append(f"| {name} | {batch} | {context} | {old:.3f} ms | {new:.3f} ms | "
                     f"{100 * (new / old - 1):+.1f}% |")
    return "\n".join(lines)


def target_lines(run):
    """Issue 14's numeric lines: (line, target, measured, met)."""
    lines = []
    decodes = decode_index(run)
    for name, batch, least in DECODE_TARGETS:
        if (name, batch, 1024) not in decodes:
            raise KeyError(f"the run has no decode of {name} at batch {batch}, context 1024")
        got = decodes[(name, batch, 1024)]["read_bandwidth_fraction"]
        lines.append((f"decode {name}, batch {batch}, context 1024", f"≥ {100 * least:.0f}%",
                      percent(got), got >= least))
    by_name = {s["shape"]: s for s in run["shapes"]}
    for name, least in PREFILL_TARGETS:
        got = by_name[name]["prefill_2048_matrix_rate_fraction"]
        lines.append((f"prefill 2048 tokens, {name}", f"≥ {100 * least:.0f}% of the matrix rate",
                      percent(got), got >= least))
    worst = max(d["host_critical_path_us_median"] for d in decodes.values())
    lines.append(("host critical path running ahead (the most of any decode row)",
                  f"≤ {HOST_CRITICAL_PATH_US_MAX:.0f} µs", f"{worst:.1f} µs",
                  worst <= HOST_CRITICAL_PATH_US_MAX))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a full run's gpu-bench.json")
    parser.add_argument("--targets", action="store_true",
                        help="issue 14's lines against the run instead of the decode table")
    parser.add_argument("--against", metavar="BASE",
                        help="each decode step beside BASE's (another gpu-bench.json)")
    args = parser.parse_args(argv)
    if args.targets and args.against:
        parser.error("--targets and --against are two different tables: ask for one")
    try:
        with open(args.run, encoding="utf-8") as f:
            run = json.load(f)
        if args.against:
            with open(args.against, encoding="utf-8") as f:
                base = json.load(f)
            print(comparison_table(run, base))
        elif args.targets:
            lines = target_lines(run)  # a missing row is refused before anything is printed
            matrix_rate = max(run["matrix_rate_flop_per_s"].values())  # the faster product's
            print(f"issue 14 against {run['commit']} (read bandwidth "
                  f"{run['read_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, matrix rate "
                  f"{matrix_rate / 1e12:.0f} TFLOP/s)")
            for line, target, got, met in lines:
                print(f"{line}: {got} (target {target}): {'MET' if met else 'NOT MET'}")
        else:
            print(decode_table(run))
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"h200_table: {args.run}: {error!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
