#!/usr/bin/env bash
# The main job on the embedded default — the `tiny` model (random weights from seed 0) on the CPU
# reference backend:
#   1. generate tokens for the bundled prompts (examples/prompts.jsonl);
#   2. simulate seed 11 of the serving world with every fault site on, recording it to a trace;
#   3. replay the trace and print the verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >/dev/null
lockstep=./build/lockstep
trace=build/demo-seed-11.trace

echo "== lockstep generate --model tiny --prompts examples/prompts.jsonl"
"$lockstep" generate --model tiny --prompts examples/prompts.jsonl --quiet
echo
echo "== lockstep sim --seed 11 --faults all --record $trace"
rm -f "$trace"
"$lockstep" sim --seed 11 --faults all --record "$trace"
echo
echo "== lockstep replay $trace"
"$lockstep" replay "$trace" --quiet
