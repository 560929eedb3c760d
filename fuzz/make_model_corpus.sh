#!/bin/sh
# Regenerates the model-file reader's seed corpus (fuzz/corpus/model_files, for
# fuzz/model_files_fuzz.cpp), from the repository root: fuzz/make_model_corpus.sh. First byte 0:
# a safetensors file; 1: a config.json. The inputs: small safetensors files of each dtype (F32,
# BF16, F16) with a __metadata__ entry, two tensors and an empty one, and every config.json of
# tests/fixtures/hf.
set -eu
dir=fuzz/corpus/model_files
mkdir -p "$dir"
python3 - "$dir" <<'PY'
import json, struct, sys
out = sys.argv[1]
def safetensors(dtype, size, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        count = 1
        for d in shape:
            count *= d
        end = offset + count * size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset += count * size
    text = json.dumps(header).encode()
    data = (bytes(range(256)) * (offset // 256 + 1))[:offset]
    return struct.pack("<Q", len(text)) + text + data
tensors = [("model.norm.weight", [8]), ("lm_head.weight", [4, 8]), ("empty", [0, 3])]
for dtype, size in (("F32", 4), ("BF16", 2), ("F16", 2)):
    with open(f"{out}/safetensors_{dtype.lower()}.bin", "wb") as f:
        f.write(b"\x00" + safetensors(dtype, size, tensors))
PY
for config in tests/fixtures/hf/*/config.json; do
  family=$(basename "$(dirname "$config")")
  { printf '\001'; cat "$config"; } > "$dir/config_$family.bin"
done
ls -l "$dir"
