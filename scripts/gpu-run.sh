#!/usr/bin/env bash
# One GPU run of the CUDA backend: tests, HF oracle, benchmark — everything under "$OUT".
#
#   scripts/gpu-run.sh package   # here (no GPU needed): build the GPU binaries into build-gpu/,
#                                # then pack stripped copies and their .so files in build-gpu/dist
#   scripts/gpu-run.sh [run]     # on the H200, with build-gpu/dist carried: run everything
#
# What comes back from a device run is at most 8 files, so the run writes exactly these:
#   env.txt            nvidia-smi, ldd of each binary, versions
#   gpu_tests.log/json GoogleTest output of lockstep_gpu_tests (every kernel and backend test)
#   sanitizer.log      compute-sanitizer memcheck on a subset (when the tool is there)
#   hf_oracle.log/json the independent oracle (HF transformers vs lockstep), when built
#   gpu_bench.json     the benchmark's figures (its log is in gpu_bench.json's sibling .log)
set -uo pipefail
cd "$(dirname "$0")/.."
DIST=build-gpu/dist
GPU_TARGETS="lockstep_gpu_tests lockstep_gpu_bench"
if [ -f tests/gpu/hf_oracle_check.cpp ]; then GPU_TARGETS="$GPU_TARGETS lockstep_hf_oracle_check"; fi

package() {
  set -e
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  if [ ! -f build-gpu/build.ninja ]; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
  fi
  # shellcheck disable=SC2086
  ninja -C build-gpu -j2 $GPU_TARGETS
  rm -rf "$DIST" && mkdir -p "$DIST/bin" "$DIST/lib"
  cp build-gpu/tests/lockstep_gpu_tests build-gpu/bench/lockstep_gpu_bench "$DIST/bin/"
  if [ -f build-gpu/tests/lockstep_hf_oracle_check ]; then
    cp build-gpu/tests/lockstep_hf_oracle_check "$DIST/bin/"
  fi
  strip "$DIST"/bin/*
  # Shared libraries the H200 host lacks (GPU.md): fmt and xxHash (no static archives here), and
  # this toolchain's libstdc++/libgcc_s for libfmt. cuBLAS comes from the host (13.1).
  for lib in libfmt.so.9 libxxhash.so.0 libstdc++.so.6 libgcc_s.so.1; do
    cp -L "/lib/x86_64-linux-gnu/$lib" "$DIST/lib/"
  done
  git rev-parse --short=12 HEAD > "$DIST/commit.txt" 2>/dev/null || echo unknown > "$DIST/commit.txt"
  git status --porcelain | grep -q . && sed -i 's/$/-dirty/' "$DIST/commit.txt" || true
  for b in "$DIST"/bin/*; do
    echo "== ldd $b"; LD_LIBRARY_PATH="$DIST/lib" ldd "$b" | grep -v -E 'linux-vdso|ld-linux'
  done
  du -sh "$DIST"
}

run() {
  OUT="${OUT:-out/gpu-run}"
  mkdir -p "$OUT"
  if [ ! -x "$DIST/bin/lockstep_gpu_tests" ]; then
    echo "gpu-run: $DIST/bin is missing: run 'scripts/gpu-run.sh package' here and carry $DIST" >&2
    exit 2
  fi
  export LD_LIBRARY_PATH="$PWD/$DIST/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local status=0
  {
    echo "commit: $(cat "$DIST/commit.txt")"; date -u
    nvidia-smi || true
    for b in "$DIST"/bin/*; do echo "== ldd $b"; ldd "$b"; done
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 || true
  } > "$OUT/env.txt" 2>&1

  echo "== GPU tests"
  timeout 240 "$DIST/bin/lockstep_gpu_tests" --gtest_output="json:$OUT/gpu_tests.json" \
      > "$OUT/gpu_tests.log" 2>&1 || status=1
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED TEST|tiny greedy' "$OUT/gpu_tests.log" | tail -40

  if command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    echo "== compute-sanitizer memcheck (subset)"
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 100 "$SAN" --tool memcheck --print-limit 20 "$DIST/bin/lockstep_gpu_tests" \
        --gtest_filter='CudaStateOps.*:OddSizes/PrefillChunk.*/1:OddBatches/DecodeBatch.*/2:OddBatches/SampleRows.*/2:OddBatches/VerifyRows.*/2:OddBatches/FillDecodeInputs.*' \
        > "$OUT/sanitizer.log" 2>&1 || echo "(sanitizer exit $?: informational; it may not work under gVisor)"
    tail -5 "$OUT/sanitizer.log"
  fi

  if [ -x "$DIST/bin/lockstep_hf_oracle_check" ] && [ -f tests/hf_oracle.py ]; then
    echo "== HF oracle"
    {
      PYTHONUNBUFFERED=1 timeout 200 env -u LD_LIBRARY_PATH python3 tests/hf_oracle.py \
          --out-dir /tmp/hf_oracle --json "$OUT/hf_oracle.json" &&
      timeout 120 "$DIST/bin/lockstep_hf_oracle_check" /tmp/hf_oracle "$OUT/hf_oracle.json"
    } > "$OUT/hf_oracle.log" 2>&1 || status=1
    tail -8 "$OUT/hf_oracle.log"
  fi

  echo "== benchmark"
  timeout 200 "$DIST/bin/lockstep_gpu_bench" "$OUT/gpu_bench.json" > "$OUT/gpu_bench.log" 2>&1 || status=1
  cat "$OUT/gpu_bench.log"
  echo "gpu-run: done, status $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return $status
}

case "${1:-run}" in
  package) package ;;
  run) run ;;
  *) echo "usage: scripts/gpu-run.sh [package|run]" >&2; exit 2 ;;
esac
