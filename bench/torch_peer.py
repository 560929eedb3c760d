#!/usr/bin/env python3
"""The PyTorch peer of lockstep's GPU benchmark, timed in the same gpu-run.sh call.

A plain PyTorch decode step — cuBLAS matmuls, scaled_dot_product_attention with GQA, the RMSNorm,
RoPE and SwiGLU of Hugging Face's Llama written out, an argmax — for the same shapes as
bench/gpu_bench.cpp (llama-1b, llama-8b; random bf16 weights from a seed), captured in ONE CUDA
graph per (batch, context) and replayed; the median of the timed replays is the step time. Also,
with --hf (or --hf-only), Hugging Face transformers' `generate` (eager, greedy) on the same shapes
at batch 1, 16, 64 and context 1024 (and llama-1b batch 1 at 192), a few tokens each.

    python3 bench/torch_peer.py --json OUT.json [--quick] [--hf | --hf-only] [--shapes llama-1b,llama-8b]

Bytes per step are counted as lockstep counts them (every linear weight and the LM head once, the
KV of every row's context), so the two figures divide by the same bandwidth.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "llama-1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                     vocab=128256, tied=True, theta=500000.0),
    "llama-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                     vocab=128256, tied=False, theta=500000.0),
}
EPS = 1e-5


def decode_bytes(s, batch, context):
    h, d = s["hidden"], s["head_dim"]
    q, kv = s["heads"] * d, s["kv_heads"] * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * s["ffn"]
    weights = 2 * (per_layer * s["layers"] + s["vocab"] * h)
    kv_bytes = 2 * batch * context * s["layers"] * 2 * kv
    return weights + kv_bytes


class Weights:
    def __init__(self, s, seed):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        h, d, f = s["hidden"], s["head_dim"], s["ffn"]
        q, kv = s["heads"] * d, s["kv_heads"] * d

        def linear(out, inp):
            b = 1.0 / math.sqrt(inp)
            return torch.empty(out, inp, device="cuda", dtype=torch.bfloat16).uniform_(-b, b, generator=gen)

        def norm(n):
            return torch.empty(n, device="cuda", dtype=torch.bfloat16).uniform_(0.875, 1.125, generator=gen)

        self.embedding = torch.empty(s["vocab"], h, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
        self.layers = []
        for _ in range(s["layers"]):
            self.layers.append(dict(attn_norm=norm(h), wqkv=linear(q + 2 * kv, h), wo=linear(h, q),
                                    ffn_norm=norm(h), wgu=linear(2 * f, h), wdown=linear(h, f)))
        self.final_norm = norm(h)
        self.head = self.embedding if s["tied"] else linear(s["vocab"], h)


def rms_norm(x, w):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return xf.to(torch.bfloat16) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Step:
    """One decode step at a fixed context: every row writes K/V at position `context` and attends
    to positions [0, context]. Static shapes and addresses, so the step captures in a graph."""

    def __init__(self, s, w, batch, context):
        self.s, self.w, self.batch, self.context = s, w, batch, context
        d = s["head_dim"]
        self.ids = torch.randint(0, s["vocab"], (batch,), device="cuda")
        inv = 1.0 / (s["theta"] ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
        angles = torch.cat((context * inv, context * inv))
        self.cos = angles.cos().to(torch.bfloat16)
        self.sin = angles.sin().to(torch.bfloat16)
        shape = (batch, s["kv_heads"], context + 1, d)
        self.k = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(s["layers"])]
        self.v = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(s["layers"])]

    def __call__(self):
        s, w, b, c = self.s, self.w, self.batch, self.context
        d, heads, kvh = s["head_dim"], s["heads"], s["kv_heads"]
        q_size, kv_size, f = heads * d, kvh * d, s["ffn"]
        x = w.embedding[self.ids]
        for i, layer in enumerate(w.layers):
            qkv = rms_norm(x, layer["attn_norm"]) @ layer["wqkv"].t()
            q = qkv[:, :q_size].view(b, heads, 1, d)
            k = qkv[:, q_size:q_size + kv_size].view(b, kvh, 1, d)
            v = qkv[:, q_size + kv_size:].view(b, kvh, 1, d)
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
            self.k[i][:, :, c:c + 1].copy_(k)
            self.v[i][:, :, c:c + 1].copy_(v)
            attn = F.scaled_dot_product_attention(q, self.k[i], self.v[i], enable_gqa=True)
            x = x + attn.reshape(b, q_size) @ layer["wo"].t()
            gu = rms_norm(x, layer["ffn_norm"]) @ layer["wgu"].t()
            x = x + (F.silu(gu[:, :f]) * gu[:, f:]) @ layer["wdown"].t()
        logits = rms_norm(x, w.final_norm) @ w.head.t()
        self.ids.copy_(logits.argmax(-1))


def time_graph(step, replays):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    del graph
    return times[len(times) // 2]


def copy_bandwidth():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    times.sort()
    return 2 * n / times[len(times) // 2]


def hf_model(shape):
    from transformers import LlamaConfig, LlamaForCausalLM
    s = SHAPES[shape]
    # RoPE's theta is left at its default: it changes no cost.
    config = LlamaConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                         num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                         head_dim=s["head_dim"], intermediate_size=s["ffn"], vocab_size=s["vocab"],
                         rms_norm_eps=EPS, tie_word_embeddings=s["tied"], max_position_embeddings=4096)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy of the 8B weights
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = None  # run every step: no early stop
    return model


def hf_generate(model, vocab, batch, context, new_tokens):
    """ms per generated token at (batch, context): generate(1 + new_tokens) minus generate(1),
    over new_tokens, so the prompt's prefill is left out. Both after a warm-up generate(1)."""
    prompt = torch.randint(0, vocab, (batch, context), device="cuda")
    kwargs = dict(do_sample=False, pad_token_id=0)

    def timed(tokens):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
        torch.cuda.synchronize()
        return time.perf_counter() - begin

    timed(1)  # warm-up
    one = timed(1)
    more = timed(1 + new_tokens)
    return (more - one) / new_tokens * 1e3


# HF transformers' generate (eager, greedy) on lockstep's shapes: llama-1b batch 1 at context 192,
# then both shapes at batch 1, 16, 64 at context 1024, with few generated tokens to bound the run.
HF_CASES = [("llama-1b", 1, 192), ("llama-1b", 1, 1024), ("llama-1b", 16, 1024), ("llama-1b", 64, 1024),
            ("llama-8b", 1, 1024), ("llama-8b", 16, 1024), ("llama-8b", 64, 1024)]


def hf_all(out, shapes, new_tokens, budget_s):
    start = time.perf_counter()
    for shape in shapes:
        cases = [c for c in HF_CASES if c[0] == shape]
        if not cases:
            continue
        if time.perf_counter() - start > budget_s:
            print(f"  HF generate {shape}: skipped (past the {budget_s:.0f} s budget)", flush=True)
            continue
        try:
            model = hf_model(shape)
        except Exception as e:
            print(f"  HF generate {shape}: FAILED to build the model {e!r}", flush=True)
            continue
        for _, batch, context in cases:
            if time.perf_counter() - start > budget_s:
                print(f"  HF generate {shape} batch {batch} context {context}: skipped (budget)", flush=True)
                continue
            try:
                ms = hf_generate(model, SHAPES[shape]["vocab"], batch, context, new_tokens)
            except Exception as e:
                print(f"  HF generate {shape} batch {batch} context {context}: FAILED {e!r}", flush=True)
                continue
            print(f"  HF transformers generate (eager, greedy) {shape} batch {batch} context {context}: "
                  f"{ms:.2f} ms/token", flush=True)
            out["hf_generate"].append(dict(shape=shape, batch=batch, context=context, step_ms=ms,
                                           new_tokens=new_tokens))
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--hf", action="store_true", help="also time HF transformers' generate (HF_CASES)")
    p.add_argument("--hf-only", action="store_true", help="time only HF transformers' generate")
    p.add_argument("--hf-budget-s", type=float, default=100.0,
                   help="start no HF case after this many seconds of HF timing")
    p.add_argument("--shapes", default="llama-1b,llama-8b")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "command": "bench/torch_peer.py", "decode": [], "hf_generate": []}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    out["copy_bandwidth_bytes_per_s"] = copy_bandwidth()
    print(f"torch {torch.__version__} on {out['gpu']}: copy bandwidth {out['copy_bandwidth_bytes_per_s'] * 1e-12:.2f} TB/s", flush=True)
    batches = [1, 64] if a.quick else [1, 16, 64]
    contexts = [192] if a.quick else [192, 1024]
    replays = 20 if a.quick else 50
    with torch.inference_mode():
        for shape in ([] if a.hf_only else a.shapes.split(",")):
            s = SHAPES[shape]
            w = Weights(s, 1234)
            for context in contexts:
                for batch in batches:
                    try:
                        ms = time_graph(Step(s, w, batch, context), replays)
                    except Exception as e:  # one shape failing must not lose the others
                        print(f"  {shape} batch {batch} context {context}: FAILED {e!r}", flush=True)
                        continue
                    bytes_moved = decode_bytes(s, batch, context + 1)
                    fraction = bytes_moved / (ms * 1e-3) / out["copy_bandwidth_bytes_per_s"]
                    print(f"  torch graph {shape} decode batch {batch:2d} context {context:4d}: {ms:.3f} ms/step, "
                          f"{bytes_moved * 1e-9:.2f} GB, {fraction * 100:.1f}% of torch's copy BW", flush=True)
                    out["decode"].append(dict(shape=shape, batch=batch, context=context, step_ms_median=ms,
                                              bytes_moved=bytes_moved, replays=replays))
                    torch.cuda.empty_cache()
            del w
            torch.cuda.empty_cache()
        if a.hf or a.hf_only:
            hf_all(out, a.shapes.split(","), 4 if a.quick else 8, a.hf_budget_s)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
