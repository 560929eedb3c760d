#!/usr/bin/env python3
"""Small Hugging Face checkpoints of each family lockstep serves, with their references (issue 11).

For each family below, builds a random-weight model with transformers' own classes from a seed,
perturbs the tensors HF initialises to constants (biases to 0, norm weights to 1) so that they
matter, saves it with save_pretrained (bf16 safetensors: small, and exactly representable in the
fp32 both sides compute in), then **reloads the saved directory** with AutoModelForCausalLM in fp32
and computes, from that reloaded model only, greedy decoding of NEW_TOKENS tokens for each prompt
(a plain KV-cache loop, no EOS) and the first-step logits (the last prompt position). Prompts run
up to 700 tokens so RoPE scaling (llama3 with original_max_position_embeddings 128, linear) changes
the result. Writes OUT/<family>/{config.json, model.safetensors, hf_reference.json} and
OUT/manifest.json.

`llama3-legacy` is the `llama3` model with its config rewritten in the legacy form hub checkpoints
carry (`rope_theta` + `rope_scaling`); transformers reads both forms, and the script checks that the
reloaded legacy model gives logits equal to the `rope_parameters` one. Its weights are the llama3
directory's, so only its config.json and reference are written.

    python3 tests/hf_fixtures.py --out-dir tests/fixtures/hf

`bamba` is a hybrid (issue 19): BambaForCausalLM with Mamba2 mixer layers and one attention layer
(layers: mamba, attention, mamba, mamba; hidden 64; small Mamba heads, state and chunk). Its
reference is BAMBA_PROMPTS prompts (lengths up to 400, so they cross many 16-token pages and
lockstep's 256-token prefill chunks) x BAMBA_NEW_TOKENS greedy tokens, each step recomputing the
whole sequence with transformers' torch_forward path (HF's Bamba returns no cache unless one is
built by hand; the recompute is the plain forward, with no cache semantics to trust). The cached
decode loop is run too and its agreement printed, as a cross-check of HF's own decode path.

    python3 tests/hf_fixtures.py --out-dir tests/fixtures/hf --only bamba

Needs torch and transformers (the H200 host has torch 2.11, transformers 5.17); no network.
"""
import argparse
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

SEED = 20261201
NEW_TOKENS = 24
PROMPT_LENGTHS = [5, 37, 130, 260, 400, 520, 640, 700]
VOCAB = 512

COMMON = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=1024,
              rms_norm_eps=1e-6, hidden_act="silu",
              # HF's 0.02 leaves the residual stream to the embedding: with tied embeddings the
              # model then repeats its last token, which makes a weak oracle.
              initializer_range=0.1)

BAMBA_PROMPTS = 16
BAMBA_NEW_TOKENS = 32
BAMBA_PROMPT_LENGTHS = [5, 17, 33, 48, 64, 90, 120, 150, 181, 200, 233, 256, 270, 301, 333, 400]
BAMBA = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=1024,
             rms_norm_eps=1e-5, hidden_act="silu", initializer_range=0.1,
             tie_word_embeddings=False, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16,
             mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
             mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
             # A finite clamp that bites (softplus(dt + dt_bias) spreads around 1); the default
             # (0, inf) would be written as the non-JSON token Infinity.
             time_step_limit=(0.05, 1.2))

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128}


def families():
    """(name, config class name, config kwargs, rope parameters)."""
    return [
        ("llama3", "LlamaConfig", dict(COMMON, head_dim=32, tie_word_embeddings=True,
                                       attention_bias=False, mlp_bias=False), LLAMA3_ROPE),
        ("llama-linear", "LlamaConfig", dict(COMMON, head_dim=32, tie_word_embeddings=False),
         {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
        ("qwen2", "Qwen2Config", dict(COMMON, tie_word_embeddings=False, use_sliding_window=False),
         {"rope_type": "default", "rope_theta": 1000000.0}),
        ("qwen3", "Qwen3Config", dict(COMMON, head_dim=64, tie_word_embeddings=True,
                                      use_sliding_window=False, attention_bias=False),
         {"rope_type": "default", "rope_theta": 1000000.0}),
        ("mistral", "MistralConfig", dict(COMMON, head_dim=32, tie_word_embeddings=False,
                                          sliding_window=None),
         {"rope_type": "default", "rope_theta": 1000000.0}),
        ("bamba", "BambaConfig", BAMBA, {"rope_type": "default", "rope_theta": 10000.0}),
    ]


def make_config(class_name, kwargs, rope):
    cls = getattr(transformers, class_name)
    try:
        config = cls(**kwargs, rope_parameters=dict(rope))
    except TypeError:
        config = cls(**kwargs, rope_theta=rope["rope_theta"],
                     rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"})
    config._attn_implementation = "eager"
    return config


def perturb(model, generator):
    """Biases ~ N(0, 0.2), norm weights 1 + N(0, 0.2): HF initialises them to 0 and 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))


def perturb_mamba(model, generator):
    """A_log, D and dt_bias away from HF's log(1..H), 1 and 1, so that each matters per head."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mamba.A_log") or name.endswith("mamba.dt_bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
            elif name.endswith("mamba.D"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=generator))


def lockstep_rotary_dim(config_json, head_dim):
    """The dims lockstep's Bamba rotates for this config.json (core/model/hf_config.cpp,
    read_partial_rotary): int(head_dim * rope_parameters.partial_rotary_factor), 0.5 when absent."""
    factor = (config_json.get("rope_parameters") or {}).get("partial_rotary_factor", 0.5)
    return int(head_dim * factor)


def hf_rotation(model):
    """What transformers' Bamba rotates: (rotated dims, inv_freq, head_dim, theta)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = model.model.rotary_emb.inv_freq.double()
    return 2 * inv_freq.numel(), inv_freq, head_dim, config.rope_parameters["rope_theta"]


def check_rotation(model, config_json):
    """lockstep rotates the first rotary_dim dims of each q/k head, rotate-half within them, with
    inv_freq_j = theta^(-2j/rotary_dim), and passes the rest through: transformers must too."""
    from transformers.models.bamba import modeling_bamba
    rotated, inv_freq, head_dim, theta = hf_rotation(model)
    want = lockstep_rotary_dim(config_json, head_dim)
    print(f"hf_fixtures: bamba: RoPE rotates {rotated} of head_dim {head_dim}; lockstep rotates "
          f"{want}", flush=True)
    if rotated != want:
        return False
    expected = 1.0 / theta ** (torch.arange(0, want, 2, dtype=torch.float64) / want)
    if not torch.allclose(inv_freq, expected, rtol=1e-6, atol=0.0):
        print(f"hf_fixtures: bamba: inv_freq {inv_freq.tolist()} is not theta^(-2j/{want}) "
              f"{expected.tolist()}", flush=True)
        return False
    g = torch.Generator().manual_seed(SEED + 300)
    q, k = (torch.randn(1, 2, 5, head_dim, generator=g) for _ in range(2))
    cos, sin = model.model.rotary_emb(q, torch.arange(5)[None])
    q_out, k_out = modeling_bamba.apply_rotary_pos_emb(q, k, cos, sin)
    passed = torch.equal(q_out[..., want:], q[..., want:]) and torch.equal(k_out[..., want:], k[..., want:])
    moved = not torch.equal(q_out[..., :want], q[..., :want])
    print(f"hf_fixtures: bamba: apply_rotary_pos_emb keeps dims {want}.. as they are: {passed}; "
          f"rotates the first {want}: {moved}", flush=True)
    return passed and moved


def check_factor_from_rope_parameters():
    """lockstep takes a factor other than BambaConfig's 0.5 from rope_parameters; transformers'
    BambaConfig forces the top-level attribute to 0.5, so check that its rope init honours it."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    config = make_config("BambaConfig", BAMBA, rope)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    rotated, _, head_dim, _ = hf_rotation(model)
    want = lockstep_rotary_dim({"rope_parameters": rope}, head_dim)
    print(f"hf_fixtures: bamba: with rope_parameters.partial_rotary_factor 0.25 transformers "
          f"rotates {rotated} of head_dim {head_dim}; lockstep rotates {want}", flush=True)
    return rotated == want


def bamba_reference(model):
    """Greedy tokens by recomputing the whole sequence each step, and the cached loop's agreement."""
    prompts, tokens, logits = [], [], []
    with torch.no_grad():
        for i, length in enumerate(BAMBA_PROMPT_LENGTHS[:BAMBA_PROMPTS]):
            prompt = prompt_for(i, length)
            sequence, generated = list(prompt), []
            for step in range(BAMBA_NEW_TOKENS):
                out = model(torch.tensor([sequence]), use_cache=False).logits[0, -1].float()
                if step == 0:
                    logits.append([float(x) for x in out])
                generated.append(int(out.argmax()))
                sequence.append(generated[-1])
            prompts.append(prompt)
            tokens.append(generated)
    agree = cached_agreement(model, prompts, tokens)
    print(f"hf_fixtures: bamba: HF's cached decode loop agrees with the recompute on {agree}",
          flush=True)
    return prompts, tokens, logits


def cached_agreement(model, prompts, tokens):
    try:
        from transformers.models.bamba.modeling_bamba import HybridMambaAttentionDynamicCache
    except ImportError as e:
        return f"(not run: {e})"
    equal = total = 0
    with torch.no_grad():
        for prompt, want in zip(prompts, tokens):
            cache = HybridMambaAttentionDynamicCache(model.config, 1, dtype=torch.float32)
            ids = torch.tensor([prompt])
            out = model(ids, past_key_values=cache, use_cache=True,
                        cache_position=torch.arange(len(prompt)))
            nxt, got = int(out.logits[0, -1].argmax()), []
            for t in range(len(want)):
                got.append(nxt)
                position = torch.tensor([len(prompt) + t])
                out = model(torch.tensor([[nxt]]), past_key_values=cache, use_cache=True,
                            cache_position=position)
                nxt = int(out.logits[0, -1].argmax())
            equal += sum(a == b for a, b in zip(got, want))
            total += len(want)
    return f"{equal}/{total} tokens"


def prompt_for(i, length):
    g = torch.Generator().manual_seed(SEED + 1000 + i)
    return torch.randint(0, VOCAB, (length,), generator=g).tolist()


def load_back(directory):
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                     attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32,
                                                     attn_implementation="eager")
    return model.eval()


def reference_of(model):
    prompts, tokens, logits = [], [], []
    with torch.no_grad():
        for i, length in enumerate(PROMPT_LENGTHS):
            prompt = prompt_for(i, length)
            ids = torch.tensor([prompt])
            out = model(ids, use_cache=True)
            logits.append([float(x) for x in out.logits[0, -1].float()])
            past, nxt, generated = out.past_key_values, int(out.logits[0, -1].argmax()), []
            for _ in range(NEW_TOKENS):
                generated.append(nxt)
                o = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, nxt = o.past_key_values, int(o.logits[0, -1].argmax())
            prompts.append(prompt)
            tokens.append(generated)
    return prompts, tokens, logits


def write_reference(directory, name, prompts, tokens, logits):
    gaps = sorted(sorted(l, reverse=True)[0] - sorted(l, reverse=True)[1] for l in logits)
    reference = {"family": name, "seed": SEED, "torch": torch.__version__,
                 "transformers": transformers.__version__, "dtype": "float32", "device": "cpu",
                 "computed_from": "the saved directory, reloaded with AutoModelForCausalLM",
                 "prompts": prompts, "tokens": tokens, "first_logits": logits}
    with open(os.path.join(directory, "hf_reference.json"), "w") as f:
        json.dump(reference, f)
    distinct = sum(len(set(t)) for t in tokens) / len(tokens)
    lengths = [len(p) for p in prompts]
    print(f"hf_fixtures: {name}: {len(prompts)} prompts (lengths {lengths}) x {len(tokens[0])} "
          f"tokens; distinct tokens per sequence {distinct:.1f}; top-2 logit gap min {gaps[0]:.3g}",
          flush=True)


def legacy_config(config_json):
    """The same model in the legacy form: rope_theta + rope_scaling (no rope_parameters)."""
    legacy = dict(config_json)
    rope = dict(legacy.pop("rope_parameters", None) or legacy.pop("rope_scaling"))
    legacy["rope_theta"] = rope.pop("rope_theta")
    legacy["rope_scaling"] = rope
    return legacy


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--only", action="append", default=[],
                   help="write only these families (repeatable); the manifest keeps the others")
    a = p.parse_args()
    torch.use_deterministic_algorithms(True)
    manifest = {}
    manifest_path = os.path.join(a.out_dir, "manifest.json")
    if a.only and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f).get("families", {})
    for index, (name, class_name, kwargs, rope) in enumerate(families()):
        if a.only and name not in a.only:
            continue
        torch.manual_seed(SEED + index)
        config = make_config(class_name, kwargs, rope)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
        perturb(model, torch.Generator().manual_seed(SEED + 100 + index))
        if name == "bamba":
            perturb_mamba(model, torch.Generator().manual_seed(SEED + 200 + index))
        directory = os.path.join(a.out_dir, name)
        os.makedirs(directory, exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(directory)
        for extra in os.listdir(directory):  # generation_config.json: not part of the model
            if extra not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(directory, extra))
        with open(os.path.join(directory, "config.json")) as f:
            saved = json.load(f)
        print(f"hf_fixtures: {name}: config.json {json.dumps(saved, sort_keys=True)}", flush=True)
        reloaded = load_back(directory)
        if name == "bamba" and not (check_rotation(reloaded, saved) and
                                    check_factor_from_rope_parameters()):
            print("hf_fixtures: bamba: transformers and lockstep rotate different parts of each "
                  "head: fix lockstep (core/model/hf_config.cpp read_partial_rotary, "
                  "core/model/rope.cpp) before writing this fixture", flush=True)
            return 1
        prompts, tokens, logits = (bamba_reference if name == "bamba" else reference_of)(reloaded)
        write_reference(directory, name, prompts, tokens, logits)
        manifest[name] = sorted(os.listdir(directory))
        if name == "llama3":
            legacy_dir = os.path.join(a.out_dir, "llama3-legacy")
            os.makedirs(legacy_dir, exist_ok=True)
            with open(os.path.join(legacy_dir, "config.json"), "w") as f:
                json.dump(legacy_config(saved), f, indent=2)
            shutil.copy(os.path.join(directory, "model.safetensors"), legacy_dir)
            legacy = load_back(legacy_dir)
            ids = torch.tensor([prompt_for(7, PROMPT_LENGTHS[-1])])
            with torch.no_grad():
                same = torch.equal(legacy(ids).logits, reloaded(ids).logits)
            print(f"hf_fixtures: llama3-legacy: HF logits equal to the rope_parameters form: {same}",
                  flush=True)
            if not same:
                return 1
            os.remove(os.path.join(legacy_dir, "model.safetensors"))
            manifest["llama3-legacy"] = ["config.json (weights: ../llama3/model.safetensors)"]
    with open(manifest_path, "w") as f:
        json.dump({"seed": SEED, "torch": torch.__version__,
                   "transformers": transformers.__version__, "families": manifest}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
