"""A second, independent oracle for the hybrid family on the CPU (issue 19), runnable without torch.

Writes a random-weight BambaForCausalLM checkpoint (config.json as BambaConfig saves it, fp32
safetensors), serves prompts through `lockstep generate --model DIR` (chunked prefill, co-batched
rows, its sequential single-step scan in fp32), and recomputes the same greedy tokens in numpy, in
fp64, the way transformers' torch_forward computes a prefill: the whole sequence each step, the
causal conv as a padded convolution, and the SSD scan in chunks of mamba_chunk_size (intra-chunk
masked products, states carried between chunks) — a formulation of the recurrence unlike
lockstep's. The two must agree on >= 95% of the greedy tokens, and the model must not be degenerate.
The HF oracle proper (tests/hf_hybrid_test.cpp) needs the fixture generated with transformers.

usage: python3 cli_bamba_numpy.py LOCKSTEP WORKDIR
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

LOCKSTEP, WORKDIR = sys.argv[1], sys.argv[2]
CONFIG = {"architectures": ["BambaForCausalLM"], "model_type": "bamba", "vocab_size": 512,
          "tie_word_embeddings": False, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 1024,
          "attention_dropout": 0.0, "attention_bias": False, "mlp_bias": False,
          "attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2,
          "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 16,
          "mamba_conv_bias": True, "mamba_proj_bias": False, "time_step_min": 0.001,
          "time_step_max": 0.1, "time_step_limit": [0.05, 1.2], "z_loss_coefficient": 0.0,
          "partial_rotary_factor": 0.5,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                              "partial_rotary_factor": 0.5}}
H, NH, KVH = CONFIG["hidden_size"], CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
HD = H // NH
# transformers' partial rotary: RoPE over the first int(head_dim * factor) dims of each q/k head
# (rotate-half within them, frequencies over that dim), the rest passed through.
ROTARY = int(HD * CONFIG["rope_parameters"]["partial_rotary_factor"])
MH, MD, G, N, K = (CONFIG[k] for k in ("mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                                       "mamba_d_state", "mamba_d_conv"))
INNER, CONV = MH * MD, MH * MD + 2 * G * N
EPS, CHUNK = CONFIG["rms_norm_eps"], CONFIG["mamba_chunk_size"]
NEW_TOKENS, PROMPT_LENGTHS = 12, [5, 31, 60, 97, 130]


def make_weights(rng):
    w = {}
    def linear(name, out, inp):
        w[name] = rng.standard_normal((out, inp)) / np.sqrt(inp)
    def vector(name, shape, center=0.0, spread=0.1):
        w[name] = center + spread * rng.standard_normal(shape)
    w["model.embed_tokens.weight"] = rng.standard_normal((CONFIG["vocab_size"], H))
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        vector(p + "input_layernorm.weight", (H,), 1.0)
        if layer in CONFIG["attn_layer_indices"]:
            linear(p + "self_attn.q_proj.weight", NH * HD, H)
            linear(p + "self_attn.k_proj.weight", KVH * HD, H)
            linear(p + "self_attn.v_proj.weight", KVH * HD, H)
            linear(p + "self_attn.o_proj.weight", H, NH * HD)
        else:
            linear(p + "mamba.in_proj.weight", INNER + CONV + MH, H)
            vector(p + "mamba.conv1d.weight", (CONV, 1, K), 0.0, 0.5)
            vector(p + "mamba.conv1d.bias", (CONV,))
            vector(p + "mamba.dt_bias", (MH,), 0.0, 1.0)
            vector(p + "mamba.A_log", (MH,), 0.5, 0.3)
            vector(p + "mamba.D", (MH,), 1.0)
            vector(p + "mamba.norm.weight", (INNER,), 1.0)
            linear(p + "mamba.out_proj.weight", H, INNER)
        vector(p + "pre_ff_layernorm.weight", (H,), 1.0)
        linear(p + "feed_forward.gate_proj.weight", CONFIG["intermediate_size"], H)
        linear(p + "feed_forward.up_proj.weight", CONFIG["intermediate_size"], H)
        linear(p + "feed_forward.down_proj.weight", H, CONFIG["intermediate_size"])
    vector("model.final_layernorm.weight", (H,), 1.0)
    linear("lm_head.weight", CONFIG["vocab_size"], H)
    # What lockstep reads: the fp32 values; the reference computes from exactly those.
    return {k: v.astype(np.float32) for k, v in w.items()}


def write_checkpoint(directory, weights):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    header, blobs, offset = {}, [], 0
    for name, value in weights.items():
        data = value.tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def rms(x, weight):
    return weight * (x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS))


def silu(x):
    return x / (1.0 + np.exp(-x))


def segment_sums(a):
    """[..., T] -> [..., T, T]: out[i, j] = a[j+1] + ... + a[i] for i >= j, -inf above."""
    c = np.cumsum(a, -1)
    out = c[..., :, None] - c[..., None, :]
    return np.where(np.tril(np.ones((a.shape[-1],) * 2, bool)), out, -np.inf)


def ssd_chunked(x, dt, a, b, c):
    """y for x [T, h, p], dt [T, h], a [h], b/c [T, h, n], the scan in chunks of CHUNK."""
    t = x.shape[0]
    pad = (CHUNK - t % CHUNK) % CHUNK
    def chunks(v):
        return np.concatenate([v, np.zeros((pad, *v.shape[1:]))]).reshape(-1, CHUNK, *v.shape[1:])
    xc, ac, bc, cc = chunks(x * dt[..., None]), chunks(a * dt), chunks(b), chunks(c)
    ac = ac.transpose(2, 0, 1)                                   # [h, chunks, l]
    cum = np.cumsum(ac, -1)
    y_diag = np.einsum("clhn,cshn,hcls,cshp->clhp", cc, bc, np.exp(segment_sums(ac)), xc)
    states = np.einsum("clhn,hcl,clhp->chpn", bc, np.exp(cum[..., -1:] - cum), xc)
    states = np.concatenate([np.zeros((1, *states.shape[1:])), states])
    carry = np.exp(segment_sums(np.pad(cum[..., -1], ((0, 0), (1, 0)))))
    entering = np.einsum("hzc,chpn->zhpn", carry, states)[:-1]
    y_off = np.einsum("clhn,chpn,hcl->clhp", cc, entering, np.exp(cum))
    return (y_diag + y_off).reshape(-1, *x.shape[1:])[:t]


def mamba(w, x, p):
    t = x.shape[0]
    proj = x @ w[p + "in_proj.weight"].T
    gate, xbc, dt = proj[:, :INNER], proj[:, INNER:INNER + CONV], proj[:, INNER + CONV:]
    taps = w[p + "conv1d.weight"][:, 0, :]
    padded = np.concatenate([np.zeros((K - 1, CONV)), xbc])
    conv = silu(np.stack([(padded[i:i + K] * taps.T).sum(0) for i in range(t)]) + w[p + "conv1d.bias"])
    xs, b, c = conv[:, :INNER], conv[:, INNER:INNER + G * N], conv[:, INNER + G * N:]
    step = np.clip(np.logaddexp(0.0, dt + w[p + "dt_bias"]), *CONFIG["time_step_limit"])
    x_heads = xs.reshape(t, MH, MD)
    per_head = lambda v: np.repeat(v.reshape(t, G, N), MH // G, 1)
    y = ssd_chunked(x_heads, step, -np.exp(w[p + "A_log"]), per_head(b), per_head(c))
    y = (y + w[p + "D"][:, None] * x_heads).reshape(t, INNER) * silu(gate)
    return rms(y, w[p + "norm.weight"]) @ w[p + "out_proj.weight"].T


def rope(u, rotary):
    """u [t, heads, HD] with its first `rotary` dims rotated for positions 0..t-1."""
    theta = CONFIG["rope_parameters"]["rope_theta"]
    freqs = np.arange(u.shape[0])[:, None] / theta ** (np.arange(0, rotary, 2) / rotary)[None]
    angles = np.concatenate([freqs, freqs], -1)[:, None]
    r, rest = u[..., :rotary], u[..., rotary:]
    half = np.concatenate([-r[..., rotary // 2:], r[..., :rotary // 2]], -1)
    return np.concatenate([r * np.cos(angles) + half * np.sin(angles), rest], -1)


def attention(w, x, p, rotary):
    t = x.shape[0]
    q = (x @ w[p + "q_proj.weight"].T).reshape(t, NH, HD)
    k = (x @ w[p + "k_proj.weight"].T).reshape(t, KVH, HD)
    v = (x @ w[p + "v_proj.weight"].T).reshape(t, KVH, HD)
    q, k = rope(q, rotary), rope(k, rotary)
    k, v = np.repeat(k, NH // KVH, 1), np.repeat(v, NH // KVH, 1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(HD)
    scores = scores + np.where(np.tril(np.ones((t, t))), 0.0, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", scores, v).reshape(t, H) @ w[p + "o_proj.weight"].T


def last_logits(w, ids, rotary):
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, w[p + "input_layernorm.weight"])
        if layer in CONFIG["attn_layer_indices"]:
            x = x + attention(w, h, p + "self_attn.", rotary)
        else:
            x = x + mamba(w, h, p + "mamba.")
        h = rms(x, w[p + "pre_ff_layernorm.weight"])
        ffn = silu(h @ w[p + "feed_forward.gate_proj.weight"].T) * (h @ w[p + "feed_forward.up_proj.weight"].T)
        x = x + ffn @ w[p + "feed_forward.down_proj.weight"].T
    return rms(x[-1], w["model.final_layernorm.weight"]) @ w["lm_head.weight"].T


def main():
    rng = np.random.default_rng(20261219)
    weights = make_weights(rng)
    model = os.path.join(WORKDIR, "bamba_numpy")
    write_checkpoint(model, weights)
    prompts = [[int(t) for t in rng.integers(0, CONFIG["vocab_size"], n)] for n in PROMPT_LENGTHS]
    prompts_path = os.path.join(WORKDIR, "bamba_numpy_prompts.jsonl")
    with open(prompts_path, "w") as f:
        for i, prompt in enumerate(prompts):
            f.write(json.dumps({"id": i + 1, "prompt": prompt, "max_new_tokens": NEW_TOKENS}) + "\n")
    run = subprocess.run([LOCKSTEP, "generate", "--model", model, "--prompts", prompts_path,
                          "--max-batch-rows", "3", "--prefill-chunk-tokens", "48", "-q"],
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        print(f"cli_bamba_numpy: lockstep generate failed ({run.returncode}): {run.stderr}")
        return 1
    got = {json.loads(line)["id"]: json.loads(line)["tokens"] for line in run.stdout.splitlines()}
    weights64 = {k: v.astype(np.float64) for k, v in weights.items()}
    equal, planted, total = 0, 0, 0
    distinct = set()
    for i, prompt in enumerate(prompts):
        expected = greedy(weights64, prompt, ROTARY)
        # The planted reference: the whole head rotated (lockstep's Bamba before it read the
        # factor). lockstep must agree with it clearly less, or this oracle cannot see the rotary.
        whole = greedy(weights64, prompt, HD)
        mine = got[i + 1]
        equal += sum(a == b for a, b in zip(mine, expected))
        planted += sum(a == b for a, b in zip(mine, whole))
        total += len(expected)
        distinct.update(expected)
        print(f"cli_bamba_numpy: prompt {i + 1} ({len(prompt)} tokens): numpy {expected}, "
              f"lockstep {mine}, numpy rotating all {HD} dims {whole}")
    print(f"cli_bamba_numpy: {equal}/{total} greedy tokens agree (RoPE over {ROTARY} of {HD} "
          f"dims); {len(distinct)} distinct tokens; the planted whole-head reference agrees on "
          f"{planted}/{total}")
    return 0 if equal >= 0.95 * total and len(distinct) >= 10 and planted < 0.8 * total else 1


def greedy(weights64, prompt, rotary):
    sequence, tokens = list(prompt), []
    for _ in range(NEW_TOKENS):
        tokens.append(int(np.argmax(last_logits(weights64, np.array(sequence), rotary))))
        sequence.append(tokens[-1])
    return tokens

if __name__ == "__main__":
    sys.exit(main())
