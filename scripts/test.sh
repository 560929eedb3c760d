#!/usr/bin/env bash
# Builds lockstep and runs every CPU test (GPU tests are labelled `gpu` and run on the H200).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
ctest --test-dir build -L cpu --output-on-failure --parallel "$(nproc)"
