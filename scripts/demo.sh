#!/usr/bin/env bash
# The main job on the embedded default: the `tiny` model (random weights from seed 0) on the CPU
# reference backend, generating for the bundled prompts. Extra arguments go to `lockstep generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >/dev/null
./build/lockstep generate --model tiny --prompts examples/prompts.jsonl "$@"
