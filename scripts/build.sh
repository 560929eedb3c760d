#!/usr/bin/env bash
# Configures and builds lockstep into build/ (Release, assertions on, warnings as errors).
# The CUDA backend is built when nvcc is found (on PATH or in /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --parallel "$(nproc)"
