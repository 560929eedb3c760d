#!/usr/bin/env python3
"""Records/s of lockstep.open_trace over a large trace (a simulator run recorded with many
requests, unless --trace names one), next to the C++ reader alone (`lockstep trace inspect`).

    PYTHONPATH=build/python python3 bench/python_open_trace.py --lockstep build/lockstep
"""

import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import time

import lockstep

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lockstep", default=str(ROOT / "build" / "lockstep"))
    parser.add_argument("--trace", help="an existing trace (default: record a simulator run)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--json")
    args = parser.parse_args()
    path = args.trace
    if not path:
        path = os.path.join(tempfile.mkdtemp(), "big.trace")
        subprocess.run([args.lockstep, "sim", "--seed", "5", "--requests", str(args.requests),
                        "--no-twin", "--record", path], check=True, capture_output=True)
    size = os.path.getsize(path)
    start = time.perf_counter()
    subprocess.run([args.lockstep, "trace", "inspect", path], check=True, capture_output=True)
    cpp_seconds = time.perf_counter() - start
    start = time.perf_counter()
    trace = lockstep.open_trace(path)
    count = sum(1 for _ in trace) + 1  # with the header
    seconds = time.perf_counter() - start
    result = {"trace_bytes": size, "records": count, "python_seconds": seconds,
              "python_records_per_s": count / seconds, "python_mb_per_s": size / seconds / 1e6,
              "cpp_inspect_seconds": cpp_seconds}
    print(f"{path}: {size / 1e6:.1f} MB, {count} records")
    print(f"  lockstep.open_trace: {seconds:.2f} s, {count / seconds:,.0f} records/s, {size / seconds / 1e6:.1f} MB/s")
    print(f"  lockstep trace inspect (C++ reader alone, same checks): {cpp_seconds:.2f} s")
    print(f"  a 1 GB trace at this rate: {1e9 / (size / seconds):.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
