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
    print(f"hf_fixtures: {name}: {len(prompts)} prompts (lengths {PROMPT_LENGTHS}) x {NEW_TOKENS} "
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
    a = p.parse_args()
    torch.use_deterministic_algorithms(True)
    manifest = {}
    for index, (name, class_name, kwargs, rope) in enumerate(families()):
        torch.manual_seed(SEED + index)
        config = make_config(class_name, kwargs, rope)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
        perturb(model, torch.Generator().manual_seed(SEED + 100 + index))
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
        prompts, tokens, logits = reference_of(reloaded)
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
    with open(os.path.join(a.out_dir, "manifest.json"), "w") as f:
        json.dump({"seed": SEED, "torch": torch.__version__,
                   "transformers": transformers.__version__, "families": manifest}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
