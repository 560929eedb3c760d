#!/usr/bin/env python3
"""A Python engine loop's overhead per decode step against the C++ serving loop.

Runs the same workload twice: `lockstep generate` (the C++ scheduler and serving loop) and
examples/tokenspeed_overlap.py's overlap loop (a Python scheduler building seed-shaped ops,
lockstep.tokenspeed.ModelExecutor converting them, the GIL released while a step runs). Both
print wall time over their serving loop only (model loading excluded); the difference per step is
what a Python engine pays on top of the executor. Writes the figures as JSON with --json.

    PYTHONPATH=build/python python3 bench/python_loop.py --lockstep build/lockstep
"""

import argparse
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import lockstep
import lockstep.tokenspeed

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("tokenspeed_overlap", ROOT / "examples" / "tokenspeed_overlap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workload(requests, prompt_tokens, new_tokens, vocab):
    return [{"id": i + 1, "prompt": [(7 * i + 13 * t) % vocab for t in range(prompt_tokens)],
             "max_new_tokens": new_tokens} for i in range(requests)]


def cpp_loop(args, prompts_path):
    """`lockstep generate`: its own summary line gives the serving loop's seconds and steps."""
    done = subprocess.run([args.lockstep, "generate", "--prompts", prompts_path, "--model", args.model,
                           "--backend", args.backend, "--max-batch-rows", str(args.batch),
                           "--pages", str(args.pages), "-o", "/dev/null"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_loop: lockstep generate exited {done.returncode}:\n{done.stderr}")
    m = re.search(r"(\d+) tokens in (\d+) steps on \S+ \(.*?([\d.]+) s\)", done.stderr)
    if not m:
        sys.exit(f"bench_loop: no summary in lockstep generate's output:\n{done.stderr}")
    return {"tokens": int(m.group(1)), "steps": int(m.group(2)), "seconds": float(m.group(3))}


def python_loop(args, specs, example):
    model = lockstep.tokenspeed.ModelExecutor(model=args.model, backend=args.backend,
                                              max_batch_rows=args.batch, pages_count=args.pages)
    # Warm-up (CUDA graphs, caches) with a request of another id, then the measured run.
    example.run([dict(specs[0], id=10**6)], model)
    scheduler, stats = example.run(specs, model)
    stats["tokens"] = sum(len(r.tokens) for r in scheduler.requests)
    stats["runs_ahead"] = model.executor.runs_ahead
    return stats


def conversion_us(args, vocab):
    """ForwardOp.from_seed of one decode op of `batch` rows, alone (no step)."""
    example = load_example()
    op = example.FlatForwardOp(request_ids=list(range(1, args.batch + 1)),
                               request_pool_indices=list(range(1, args.batch + 1)),
                               input_lengths=[1] * args.batch, prefill_lengths=[], occupied_pages=[[]] * args.batch,
                               begins=[0] * args.batch, sizes=[0] * args.batch, input_ids=[],
                               extend_prefix_lens=[], decode_input_ids=[-1] * args.batch,
                               hist_token_lens=[-1] * args.batch)
    params = [lockstep.SamplingParams()] * args.batch
    count = 2000
    start = time.perf_counter()
    for _ in range(count):
        lockstep.ForwardOp.from_seed(op, params)
    return (time.perf_counter() - start) / count * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lockstep", default=str(ROOT / "build" / "lockstep"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--pages", type=int, default=1024)
    parser.add_argument("--json")
    args = parser.parse_args()
    vocab = lockstep.model_config(args.model)["vocab_size"]
    specs = workload(args.batch, args.prompt_tokens, args.new_tokens, vocab)
    example = load_example()
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(s) + "\n" for s in specs))
    cpp = cpp_loop(args, f.name)
    py = python_loop(args, specs, example)
    cpp_ms = cpp["seconds"] / cpp["steps"] * 1e3
    py_ms = py["seconds"] / py["steps"] * 1e3
    result = {"model": args.model, "backend": args.backend, "batch": args.batch,
              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "cpp_serving_loop": cpp, "python_loop": py,
              "cpp_ms_per_step": cpp_ms, "python_ms_per_step": py_ms,
              "overhead_ms_per_step": py_ms - cpp_ms,
              "from_seed_us_per_decode_op": conversion_us(args, vocab),
              "same_token_count": cpp["tokens"] == py["tokens"]}
    print(f"{args.model} on {args.backend}, batch {args.batch}, {args.new_tokens} new tokens per request:")
    print(f"  C++ serving loop  : {cpp['steps']} steps, {cpp_ms:.3f} ms/step")
    print(f"  Python engine loop: {py['steps']} steps, {py_ms:.3f} ms/step (runs ahead: {py['runs_ahead']})")
    print(f"  overhead          : {py_ms - cpp_ms:+.3f} ms per step; ForwardOp.from_seed of a "
          f"{args.batch}-row decode op {result['from_seed_us_per_decode_op']:.1f} us")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
