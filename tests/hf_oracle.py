#!/usr/bin/env python3
"""The independent oracle (issue 6, stage c): Hugging Face transformers' Llama against lockstep.

Builds a small random-weight LlamaForCausalLM (fp32; hidden 256, 4 layers, 8 query / 4 KV heads,
head dim 32, FFN 688, vocab 1024; no RoPE scaling; untied LM head) from a seed with HF's own
initialisation, saves it with save_pretrained(safe_serialization=True) into --out-dir, and runs it
on the CPU in fp32 (eager attention): greedy generation (do_sample=False, no EOS stop) of 32 new
tokens for each of 32 prompts, one prompt at a time, and each prompt's first-step logits (the last
prompt position). Writes --out-dir/hf_reference.json; `lockstep_hf_oracle_check DIR OUT.json`
then loads the same files with ls::load_hf_directory and compares.

    python3 tests/hf_oracle.py --out-dir /tmp/hf_oracle

Needs torch and transformers (the H200 host has them); no network.
"""
import argparse
import json
import os
import sys

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

SEED = 20261129
PROMPTS = 32
NEW_TOKENS = 32


def prompt_for(i, vocab):
    g = torch.Generator().manual_seed(SEED + 1 + i)
    length = 3 + (i * 7) % 37  # 3 .. 39 tokens
    return torch.randint(0, vocab, (length,), generator=g).tolist()


def make_config_plain(directory, theta):
    """transformers 5 may write RoPE as a `rope_parameters` (or `rope_scaling`) object even when
    it is the default rotation; lockstep's loader reads the plain `rope_theta` and refuses any
    RoPE scaling. A default-type object is rewritten to the plain key (same model); anything else
    is left for the loader to refuse."""
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    rewritten = []
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if isinstance(value, dict) and value.get("rope_type", value.get("type")) == "default":
            config["rope_theta"] = value.get("rope_theta", theta)
            del config[key]
            rewritten.append(key)
    if rewritten:
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    return rewritten, config.get("rope_theta")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True)
    a = p.parse_args()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    theta = 10000.0
    config = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=32, intermediate_size=688,
                         vocab_size=1024, max_position_embeddings=512, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         hidden_act="silu")
    try:
        config._attn_implementation = "eager"
    except Exception:  # the default (sdpa) computes the same function on the CPU in fp32
        pass
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    os.makedirs(a.out_dir, exist_ok=True)
    try:
        model.save_pretrained(a.out_dir, safe_serialization=True)
    except TypeError:  # a transformers that always writes safetensors and dropped the argument
        model.save_pretrained(a.out_dir)
    shards = [f for f in os.listdir(a.out_dir) if f.endswith(".safetensors")]
    if not shards:
        print(f"hf_oracle: save_pretrained wrote no *.safetensors in {a.out_dir}", flush=True)
        return 1
    rewritten, saved_theta = make_config_plain(a.out_dir, theta)
    import transformers
    print(f"hf_oracle: torch {torch.__version__}, transformers {transformers.__version__}; model "
          f"saved to {a.out_dir} (fp32 safetensors; config keys rewritten: {rewritten or 'none'}; "
          f"rope_theta {saved_theta})", flush=True)
    # No EOS: every prompt runs its 32 steps, as lockstep's do (its requests have no stop ids).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    generation = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                                  pad_token_id=0)
    prompts, tokens, logits, loop_agrees = [], [], [], 0
    with torch.no_grad():
        for i in range(PROMPTS):
            prompt = prompt_for(i, config.vocab_size)
            ids = torch.tensor([prompt])
            first = model(ids).logits[0, -1].float()
            out = model.generate(ids, generation_config=generation, attention_mask=torch.ones_like(ids))
            new = out[0, len(prompt):].tolist()
            # The same greedy decode written out with the KV cache: generate must agree with it.
            step, past, manual = ids, None, []
            for _ in range(NEW_TOKENS):
                o = model(step, past_key_values=past, use_cache=True)
                past = o.past_key_values
                nxt = int(o.logits[0, -1].argmax())
                manual.append(nxt)
                step = torch.tensor([[nxt]])
            loop_agrees += manual == new
            if manual != new:  # generate post-processed something: the plain forward is the oracle
                print(f"hf_oracle: prompt {i}: generate {new[:8]}... differs from the plain greedy "
                      f"loop {manual[:8]}...; using the loop", flush=True)
            prompts.append(prompt)
            tokens.append(manual)
            logits.append([float(x) for x in first])
    top2 = [sorted(l, reverse=True)[:2] for l in logits]
    gaps = sorted(t[0] - t[1] for t in top2)
    reference = {
        "seed": SEED,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": "float32",
        "device": "cpu",
        "config_keys_rewritten": rewritten,
        "prompts": prompts,
        "tokens": tokens,
        "first_logits": logits,
        "generate_equals_manual_loop": loop_agrees,
    }
    with open(os.path.join(a.out_dir, "hf_reference.json"), "w") as f:
        json.dump(reference, f)
    distinct = sum(len(set(t)) for t in tokens) / len(tokens)
    print(f"hf_oracle: {PROMPTS} prompts x {NEW_TOKENS} greedy tokens; generate == manual loop for "
          f"{loop_agrees}/{PROMPTS}; distinct tokens per sequence {distinct:.1f}; first-step top-2 "
          f"logit gap min {gaps[0]:.3g} median {gaps[len(gaps) // 2]:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
