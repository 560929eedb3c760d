#!/usr/bin/env python3
"""A TokenSpeed-style engine loop over lockstep's executor.

A small Python scheduler plans seed-shaped FlatForwardOps; lockstep.tokenspeed.ModelExecutor runs
them; the loop overlaps like TokenSpeed's event_loop_overlap: plan step k, dispatch k, then sync
and commit step k - 1. Prints one JSON line per request, as `lockstep generate` does:

    PYTHONPATH=build/python python3 examples/tokenspeed_overlap.py --prompts examples/prompts.jsonl
"""

import argparse
import json
import sys
import time
from types import SimpleNamespace

import lockstep
import lockstep.tokenspeed


class FlatForwardOp:
    """The attributes of TokenSpeed's FlatForwardOp that this scheduler fills in."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def num_extends(self):
        return len(self.extend_prefix_lens)


class Request:
    def __init__(self, spec, context_length):
        self.id = spec["id"]
        self.prompt = spec["prompt"]
        wanted = spec.get("max_new_tokens", 16)
        self.max_new = min(wanted, context_length - len(self.prompt))
        self.capped = self.max_new < wanted
        self.stop = set(spec.get("stop", []))
        self.sampling = SimpleNamespace(temperature=spec.get("temperature", 0.0),
                                        top_k=spec.get("top_k", -1), top_p=spec.get("top_p", 1.0),
                                        min_p=spec.get("min_p", 0.0), seed=spec.get("seed"))
        self.tokens = []
        self.reason = None       # set when finished
        self.pool_row = None
        self.pages = []
        self.prefilled = False   # planned: its prefill is in a dispatched step
        self.last_step = -1      # the last step that carries it


class Scheduler:
    """Whole-prompt prefill, then one decode token per step (W = 1); pages for a request's whole
    life at admission; pool rows and pages freed after the last step that carries a request."""

    def __init__(self, specs, limits):
        self.limits = limits
        self.requests = [Request(s, limits["context_length"]) for s in specs]
        self.free_rows = list(range(1, limits["max_batch_rows"] + 1))
        self.free_pages = list(range(1, limits["pages_count"]))
        self.step = 0

    def done(self):
        return all(r.reason is not None and r.pool_row is None for r in self.requests)

    def _admit(self, r, budget):
        page = self.limits["page_size"]
        needed = -(-(len(r.prompt) + r.max_new) // page)
        if len(r.prompt) > budget or not self.free_rows or needed > len(self.free_pages):
            return False
        r.pool_row = self.free_rows.pop(0)
        r.pages, self.free_pages = self.free_pages[:needed], self.free_pages[needed:]
        return True

    def plan(self):
        """The next op, planned before the previous step's tokens are known (overlap)."""
        prefill, decode = [], []
        budget = self.limits["prefill_chunk_tokens"]
        for r in self.requests:
            if r.reason is not None:
                continue
            if r.prefilled:
                decode.append(r)
            elif r.pool_row is not None or self._admit(r, budget):
                prefill.append(r)
                budget -= len(r.prompt)
        rows = prefill + decode
        for r in rows:
            r.prefilled = True
            r.last_step = self.step
        op = FlatForwardOp(
            request_ids=[r.id for r in rows],
            request_pool_indices=[r.pool_row for r in rows],
            input_lengths=[len(r.prompt) for r in prefill] + [1] * len(decode),
            prefill_lengths=[len(r.prompt) for r in prefill],
            occupied_pages=[r.pages for r in prefill] + [[] for _ in decode],
            begins=[0] * len(rows),
            sizes=[len(r.pages) for r in prefill] + [0] * len(decode),
            input_ids=[t for r in prefill for t in r.prompt],
            extend_prefix_lens=[0] * len(prefill),
            decode_input_ids=[-1] * len(decode),
            hist_token_lens=[-1] * len(decode))
        planned = SimpleNamespace(step=self.step, op=op, rows=rows, ne=len(prefill),
                                  sampling=[r.sampling for r in rows])
        self.step += 1
        return planned

    def commit(self, planned, result):
        """A step's tokens, in the seed's layout [ne sampled][nd x W] (W = 1 here)."""
        tokens, lengths = result.output_tokens, result.output_lengths
        for i, r in enumerate(planned.rows):
            for t in tokens[i:i + int(lengths[i])]:
                self._take(r, int(t))
            if r.reason is not None and r.last_step <= planned.step and r.pool_row is not None:
                self.free_rows.append(r.pool_row)
                self.free_pages.extend(r.pages)
                r.pool_row, r.pages = None, []

    def _take(self, r, token):
        if r.reason is not None:
            return  # a lingering step's output: the request finished in the step before
        r.tokens.append(token)
        if token in r.stop:
            r.reason = "stop"
        elif len(r.tokens) >= r.max_new:
            r.reason = "context" if r.capped else "length"


def run(specs, executor):
    """The overlap loop: plan k, dispatch k, then sync and commit k - 1. Returns the scheduler
    and the loop's statistics."""
    scheduler = Scheduler(specs, executor.executor.limits)
    in_flight = None
    steps = decode_steps = 0
    start = time.perf_counter()
    while not scheduler.done():
        planned = scheduler.plan()                                    # plan k
        result = None
        if planned.rows:
            result = executor.execute_forward_op(planned.op, planned.sampling)  # dispatch k
            steps += 1
            decode_steps += planned.ne == 0
        if in_flight is not None:
            in_flight[1].sync()                                       # then commit k - 1
            scheduler.commit(*in_flight)
        in_flight = (planned, result) if result is not None else None
    seconds = time.perf_counter() - start
    return scheduler, {"steps": steps, "decode_steps": decode_steps, "seconds": seconds}


def read_prompts(path):
    specs = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                spec = json.loads(line)
                spec.setdefault("id", number)
                specs.append(spec)
    return specs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--max-batch-rows", type=int, default=16)
    parser.add_argument("--stats", action="store_true", help="loop statistics on stderr")
    args = parser.parse_args()
    executor = lockstep.tokenspeed.ModelExecutor(model=args.model, backend=args.backend,
                                                 max_batch_rows=args.max_batch_rows)
    specs = read_prompts(args.prompts)
    scheduler, stats = run(specs, executor)
    for r in scheduler.requests:
        print(json.dumps({"id": r.id, "prompt_tokens": len(r.prompt), "tokens": r.tokens,
                          "finish_reason": r.reason}))
    if args.stats:
        print(json.dumps(stats), file=sys.stderr)


if __name__ == "__main__":
    main()
