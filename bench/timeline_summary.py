#!/usr/bin/env python3
"""Where a decode step's time goes inside its CUDA graph, from an Nsight Systems kernel trace.

Reads the CSV of `nsys stats --report cuda_gpu_trace --format csv` (kernels traced with
`--cuda-graph-trace=node`, so each graph node is a row), cuts it into steps at each
`embedding_kernel` and keeps the decode steps (no prefill tile kernel; the most common
kernel count). On one stream every
kernel ends after its predecessor (under programmatic dependent launch it may start earlier and
wait), so a kernel's *exposed* time, its end less its predecessor's end, is what it adds to the
step; a step's exposed times sum to its span. Printed: the step span and the idle gap to the next
step, then each position of a middle layer's kernels (the repeating pattern) with its exposed and
its own (start to end, waiting included) time, medians over the decode steps.

  python3 bench/timeline_summary.py TRACE.csv [--label NAME]
"""
import argparse
import csv
import statistics
import sys


def read_kernels(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if any("Start" in c for c in r)), None)
    if header_at is None:
        sys.exit(f"timeline_summary: {path}: no header with a Start column")
    header = rows[header_at]

    def column(word):
        for i, c in enumerate(header):
            if c.startswith(word):
                return i
        sys.exit(f"timeline_summary: {path}: no column '{word}' in {header}")

    start, duration, name = column("Start"), column("Duration"), column("Name")
    grid = next((i for i, c in enumerate(header) if c.startswith("GrdX")), None)
    kernels = []
    for r in rows[header_at + 1:]:
        if len(r) <= max(start, duration, name) or not r[start].strip():
            continue
        label = r[name]
        if "memcpy" in label.lower() or "memset" in label.lower():
            continue
        short = label.split("(")[0].replace("(anonymous namespace)::", "")
        if grid is not None and r[grid].strip():
            short += f" grid {r[grid].strip()}"
        begin = float(r[start])
        kernels.append((begin, begin + float(r[duration]), short))
    kernels.sort()
    return kernels


def steps_of(kernels):
    steps, current = [], []
    for k in kernels:
        if "embedding_kernel" in k[2] and current:
            steps.append(current)
            current = []
        current.append(k)
    if current:
        steps.append(current)
    return steps


def period_of(names):
    """The shortest period that the middle third of a step's kernel names repeats with."""
    third = len(names) // 3
    middle = names[third:2 * third]
    for p in range(2, len(middle) // 2 + 1):
        if all(middle[i] == middle[i + p] for i in range(len(middle) - p)):
            return third, p
    return third, 0


def summarise(path, label):
    kernels = read_kernels(path)
    steps = steps_of(kernels)
    # Decode steps: no prefill chunk (whose attention takes the tile kernel), the usual length.
    plain = [s for s in steps if not any("attention_tile" in k[2] for k in s)]
    if not plain:
        sys.exit(f"timeline_summary: {path}: every step has a prefill chunk")
    counts = statistics.multimode(len(s) for s in plain)
    decode = [s for s in plain if len(s) == counts[0]]
    if len(decode) < 3:
        sys.exit(f"timeline_summary: {path}: only {len(decode)} decode steps")
    decode = decode[1:-1]  # the first after a prefill and the last may not be steady
    spans = [s[-1][1] - s[0][0] for s in decode]
    gaps = [b[0][0] - a[-1][1] for a, b in zip(steps, steps[1:]) if a in decode]
    names = [k[2] for k in decode[0]]
    first, period = period_of(names)
    idle = f"{statistics.median(gaps) / 1e3:.1f} us" if gaps else "none (no next step)"
    print(f"== {label}: {len(decode)} decode steps of {len(names)} kernels; step span median "
          f"{statistics.median(spans) / 1e3:.1f} us, idle before the next step median {idle}")
    if period == 0:
        print("  no repeating layer pattern found")
        return
    begin = first - first % period  # a layer's first kernel, if the step's head is a whole layer
    per_layer = 0.0
    print(f"  a middle layer ({period} kernels), medians over steps: exposed (adds to the step) "
          f"and own (start to end, waiting included)")
    for j in range(period):
        i = begin + j
        exposed = statistics.median(s[i][1] - s[i - 1][1] for s in decode)
        own = statistics.median(s[i][1] - s[i][0] for s in decode)
        per_layer += exposed
        print(f"    {exposed / 1e3:7.2f} us exposed {own / 1e3:7.2f} us own  {names[i]}")
    print(f"    {per_layer / 1e3:7.2f} us a layer")
    totals = {}
    for s in decode:
        for i in range(1, len(s)):
            totals.setdefault(s[i][2], []).append(s[i][1] - s[i - 1][1])
    print("  exposed time a step by kernel, the mean over the decode steps:")
    per_step = {n: sum(v) / len(decode) for n, v in totals.items()}
    for n, t in sorted(per_step.items(), key=lambda x: -x[1])[:12]:
        print(f"    {t / 1e3:8.1f} us  {n}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="CSV of nsys stats --report cuda_gpu_trace")
    parser.add_argument("--label", default=None)
    args = parser.parse_args()
    summarise(args.trace, args.label or args.trace)


if __name__ == "__main__":
    main()
