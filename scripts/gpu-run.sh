#!/usr/bin/env bash
# One GPU run of the CUDA backend: tests, HF oracle, benchmark — everything under "$OUT".
#
#   scripts/gpu-run.sh package   # here (no GPU needed): build the GPU binaries into build-gpu/,
#                                # then pack stripped, gzipped copies and their .so files in
#                                # build-gpu/dist (every device mode unpacks them first), within
#                                # the device tool's 64 MiB beside the working tree
#   scripts/gpu-run.sh [run]     # on the H200, with build-gpu/dist carried: run everything
#   scripts/gpu-run.sh tests     # on the H200: the full run's checks without its figures (every
#                                # GPU test, the CLI on CUDA, the report, the HF oracle and
#                                # fixtures), ~3 min: a merge's gate when device time is short
#   scripts/gpu-run.sh spec      # on the H200: only speculative decoding (drafter tests, generate
#                                # and replay with W = 4, sim on CUDA, the spec benchmark), ~1 min
#   scripts/gpu-run.sh report    # on the H200: only the report of a CUDA trace (cuda_report.tar), ~20 s
#   scripts/gpu-run.sh families  # on the H200: only the checkpoint families (issue 11): layer-op
#                                # tests, the HF oracle over tests/fixtures/hf on CUDA fp32 and
#                                # bf16, qwen3-0.6b and qwen2.5-7b decode at batch 1 and 64, ~2 min
#   scripts/gpu-run.sh python    # on the H200: compile the Python module's bindings (python/src)
#                                # against the host's Python (PYTHON, default python3: pybind11,
#                                # numpy, pytest) and link the archives `package` carried in
#                                # build-gpu/dist/pylib; run python/tests with backend cpu and cuda;
#                                # then the Python engine loop against the C++ serving loop. Writes
#                                # python_build.log, python_tests.log/xml, python_loop.log/json.
#   scripts/gpu-run.sh recording # on the H200: only recording (issue 12): the logits pass's record
#                                # against the CPU reference, recorded steps, run-ahead with the recorder,
#                                # CUDA trace → exact replay on CUDA and teacher-forced on the CPU,
#                                # `generate --record` / replay / check on CUDA, and
#                                # `lockstep_gpu_bench --recording` (llama-1b, llama-8b; batch 1,
#                                # 16, 64; context 1024; with and without the recorder), then the
#                                # CPU reference's `lockstep_bench_recording` on the host's idle
#                                # cores (tiny at batch 16, five runs), ~2 min.
#                                # Writes env.txt, recording_tests.log, recording_bench.log/json.
#   scripts/gpu-run.sh tp        # on the H200 (one GPU or two): only tensor parallelism (issue 18):
#                                # lockstep_gpu_tp_tests (both ranks on GPU 0; one rank per GPU when
#                                # there are two), the NCCL tests, `generate --tp 2 --backend cuda
#                                # --record` then `replay --backend cuda` (exact at TP 2) and
#                                # teacher-forced at TP 1, and `lockstep_gpu_bench --tp 2` (llama-8b,
#                                # batch 1 and 64, context 1024), ~3 min. Writes env.txt,
#                                # tp_tests.log/json, tp_bench.log/json.
#   scripts/gpu-run.sh hybrid    # on the H200: only the hybrid family (issue 19): the RoPE, Mamba
#                                # mixer/pool, chunked scan and hybrid backend tests (CUDA vs CPU
#                                # on a random Bamba, state rules, determinism, swap retraction,
#                                # refusals, the simulator's hybrid world), the HF oracle on
#                                # tests/fixtures/hf/bamba, a hybrid recorded with the CLI on CUDA
#                                # replayed there, `lockstep sim --model tiny-hybrid --backend
#                                # cuda` (4 seeds, every fault site), and `lockstep_gpu_bench --hybrid`
#                                # (Bamba-9B's shape, batch 1 and 64, context 1024), under 10 min.
#                                # Writes env.txt, hybrid_tests.log/json, hybrid_bench.log/json.
#   scripts/gpu-run.sh fusion    # on the H200: only the decode GEMV's fused forms (issue 14): their
#                                # bit-for-bit tests against the unfused kernels, the layer-op,
#                                # backend, hybrid and determinism tests, the HF fixtures, and
#                                # `lockstep_gpu_bench --fusion` (llama-1b, llama-8b; batch 1, 4,
#                                # 8; context 1024; fused and unfused), ~4 min. Writes env.txt,
#                                # gpu_tests.log/json, hf_oracle.log/json, fusion_bench.log/json.
#   scripts/gpu-run.sh sampling  # on the H200: only the device sampler: its tests against the CPU
#                                # definition (tokens, verify, every weight's bits) and
#                                # `lockstep_gpu_bench --sampling` (llama-1b, llama-8b; batch 1
#                                # and 64; context 1024; sampled at temperature 0.8, top-p 0.95
#                                # against greedy), ~3 min. Writes env.txt, gpu_tests.log/json,
#                                # sampling_bench.log/json.
#   scripts/gpu-run.sh attention-profile
#                                # on the H200: Nsight Compute (--set full) over decode attention's
#                                # split kernel at batch 64, context 1024, llama-1b and llama-8b
#                                # heads, ~1 min. Writes env.txt, attention_ncu.log,
#                                # attention_sass_llama-{1b,8b}.csv.
#   scripts/gpu-run.sh pack-python [BUILD_DIR]
#                                # here: what `package` adds for the python mode, from BUILD_DIR
#                                # (default build-gpu) into $DIST; with DIST=/tmp/d and
#                                # PYTHON=/usr/bin/python3 the python mode runs here too (no GPU:
#                                # the CUDA cases skip)
#
# What comes back from a device run is at most 8 files, so the run writes exactly these:
#   env.txt            nvidia-smi, ldd of each binary, versions
#   gpu_tests.log/json GoogleTest output of lockstep_gpu_tests (every kernel and backend test;
#                      the JSON is this binary's) and of lockstep_gpu_tp_tests, then the CLI on
#                      CUDA: generate/replay (W = 1 and W = 4 with the n-gram drafter) and
#                      `lockstep sim --backend cuda --seeds 1..20`; compute-sanitizer memcheck on
#                      a subset (when the tool is there) appended to the log
#   cuda_report.tar    `lockstep report` of a trace recorded on CUDA (generate --backend cuda
#                      --record, llama-1b, W = 4 with the n-gram drafter, 64 prompts): report.html,
#                      report.json, replay.json (the exact CUDA replay it shows), report.log
#   hf_oracle.log/json the independent oracle (HF transformers vs lockstep): a model made by
#                      tests/hf_oracle.py there, then every family of tests/fixtures/hf (the log
#                      has each run; the JSON has the fixtures' figures under "fixtures")
#   gpu_bench.log/json the benchmark's figures, with the PyTorch peer's (bench/torch_peer.py)
#                      merged in under "peer" and a side-by-side table at the end of the log, and
#                      the speculative-decoding benchmark's (lockstep_gpu_spec_bench) under
#                      "speculative"; then paged attention alone (lockstep_gpu_attention_bench:
#                      decode, and prefill and mixed steps with the tile kernel and without),
#                      appended to the log
# The parts' time limits add up to more than the device tool's 600 s per command; a full run takes
# about 7 minutes (the qwen shapes and the HF fixtures added about 1).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu-libs.sh
. scripts/gpu-libs.sh
DIST=${DIST:-build-gpu/dist}
# The localisation GPU tests (tests/gpu/localise_gpu_test.cpp) run lockstep and
# lockstep_planted_cuda from here.
export LOCKSTEP_BIN_DIR=${LOCKSTEP_BIN_DIR:-$(realpath -m "$DIST/bin")}
# What a TP run sets before CUDA starts (the README's tensor parallelism: no NVLink multicast,
# modules loaded eagerly, every hardware queue), for the tp mode and the full run's TP tests.
TP_ENV=(NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32)
GPU_TARGETS="lockstep_gpu_tests lockstep_gpu_tp_tests lockstep_gpu_bench lockstep_gpu_spec_bench lockstep_gpu_attention_bench lockstep_gpu_mamba_bench lockstep_gpu_boundary_bench lockstep lockstep_planted_cuda lockstep_bench_recording"
# The archives the python mode links (position independent: python/CMakeLists.txt makes them so).
PY_ARCHIVES="lockstep_backends lockstep_replay lockstep_trace lockstep_scheduler lockstep_kernels lockstep_core"
if [ -f tests/gpu/hf_oracle_check.cpp ]; then GPU_TARGETS="$GPU_TARGETS lockstep_hf_oracle_check"; fi

# The start of every device mode: $OUT made, the carried binaries there (the first argument is
# the one the mode needs), their libraries on the loader's path, and $OUT/env.txt begun (the
# commit, the date, nvidia-smi).
begin_mode() {
  OUT="${OUT:-out/gpu-run}"
  mkdir -p "$OUT"
  local packed
  for packed in "$DIST"/bin/*.gz "$DIST"/pylib/*.gz; do
    [ -f "$packed" ] || continue
    gunzip -f "$packed" || { echo "gpu-run: cannot unpack $packed" >&2; exit 2; }
  done
  [ -d "$DIST/bin" ] && chmod +x "$DIST"/bin/* 2>/dev/null
  if [ ! -x "$DIST/bin/$1" ]; then
    echo "gpu-run: $DIST/bin is missing: run 'scripts/gpu-run.sh package' here and carry $DIST" >&2
    exit 2
  fi
  export LD_LIBRARY_PATH="$(realpath "$DIST")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  { echo "commit: $(cat "$DIST/commit.txt")"; date -u; nvidia-smi || true; } > "$OUT/env.txt" 2>&1
}

# One part of a mode: run_part [--new] [--show] LOG SECONDS CMD...
# CMD under a time limit of SECONDS, its output appended to LOG (--new: LOG started afresh;
# --show: printed as well). A part that fails or runs out of time marks the mode failed: it sets
# `status`, the calling mode's local (a bash function sees its caller's locals). It returns CMD's
# status, so parts chain with && where a later one needs the earlier one's output.
run_part() {
  local new=0 show=0 rc=0
  while [ "${1:-}" = --new ] || [ "${1:-}" = --show ]; do
    [ "$1" = --new ] && new=1
    [ "$1" = --show ] && show=1
    shift
  done
  local log="$1" seconds="$2"
  shift 2
  [ $new -eq 1 ] && : > "$log"
  if [ $show -eq 1 ]; then
    timeout "$seconds" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
  else
    timeout "$seconds" "$@" >> "$log" 2>&1 || rc=$?
  fi
  [ $rc -eq 0 ] || status=1
  return $rc
}

# The GPU tests matching gtest FILTER, within SECONDS, into gpu_tests.log/json; their summary
# lines (and those matching EXTRA, an extended regex) shown. A failure sets the caller's status.
run_gpu_tests() {
  local filter="$1" seconds="$2" extra="${3:-}"
  run_part --new "$OUT/gpu_tests.log" "$seconds" "$DIST/bin/lockstep_gpu_tests" \
      --gtest_filter="$filter" --gtest_output="json:$OUT/gpu_tests.json"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED TEST${extra:+|$extra}" "$OUT/gpu_tests.log" | tail -24
}

# A mode's last line: its name (empty for the full run), its status and what it wrote.
mode_done() {
  echo "gpu-run${1:+ $1}: done, status $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

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
  cp build-gpu/tests/lockstep_gpu_tests build-gpu/tests/lockstep_gpu_tp_tests build-gpu/bench/lockstep_gpu_bench \
     build-gpu/bench/lockstep_gpu_spec_bench build-gpu/bench/lockstep_gpu_attention_bench \
     build-gpu/bench/lockstep_gpu_mamba_bench build-gpu/bench/lockstep_gpu_boundary_bench \
     build-gpu/bench/lockstep_bench_recording \
     build-gpu/lockstep build-gpu/lockstep_planted_cuda "$DIST/bin/"
  if [ -f build-gpu/tests/lockstep_hf_oracle_check ]; then
    cp build-gpu/tests/lockstep_hf_oracle_check "$DIST/bin/"
  fi
  strip "$DIST"/bin/*
  # Shared libraries the H200 host lacks (scripts/gpu-libs.sh), and Google Benchmark's for the CPU
  # recording benchmark.
  for lib in $GPU_HOST_LACKS_LIBS libbenchmark.so.1debian; do
    cp -L "/lib/x86_64-linux-gnu/$lib" "$DIST/lib/"
  done
  git rev-parse --short=12 HEAD > "$DIST/commit.txt" 2>/dev/null || echo unknown > "$DIST/commit.txt"
  git status --porcelain | grep -q . && sed -i 's/$/-dirty/' "$DIST/commit.txt" || true
  for b in "$DIST"/bin/*; do
    echo "== ldd $b"; LD_LIBRARY_PATH="$DIST/lib" ldd "$b" | grep -v -E 'linux-vdso|ld-linux'
  done
  pack_python build-gpu
  # Packed: the binaries and archives are ~77 MB as they are, ~35 MB gzipped.
  gzip -f "$DIST"/bin/* "$DIST"/pylib/*.a
  check_device_carry "$DIST"
}

# What the python mode needs besides the binaries: the lockstep archives of BUILD_DIR (with the
# CUDA backend), this toolchain's static CUDA runtime they were compiled against, and fmt's
# headers (core/check.h includes them; the H200 host has none). The binding sources compile
# against only these, the repository's headers, pybind11 and the host's Python.
pack_python() {
  set -e
  local build="${1:-build-gpu}" cuda_lib=/usr/local/cuda/lib64
  # shellcheck disable=SC2086
  ninja -C "$build" -j2 $PY_ARCHIVES lockstep
  rm -rf "$DIST/pylib" "$DIST/include" && mkdir -p "$DIST/pylib" "$DIST/include" "$DIST/bin" "$DIST/lib"
  for a in $PY_ARCHIVES; do
    find "$build/" -name "lib$a.a" -exec cp {} "$DIST/pylib/" \;  # "/": build-gpu may be a link
  done
  cp "$cuda_lib/libcudart_static.a" "$DIST/pylib/"
  cp -r /usr/include/fmt "$DIST/include/"
  # A dist made from another build (testing the python mode here) gets that build's CLI.
  [ -x "$DIST/bin/lockstep" ] || cp "$build/lockstep" "$DIST/bin/"
  for lib in $GPU_HOST_LACKS_LIBS; do
    [ -f "$DIST/lib/$lib" ] || cp -L "/lib/x86_64-linux-gnu/$lib" "$DIST/lib/"
  done
  ls -la "$DIST/pylib"
}

# The highest GLIBCXX symbol version a libstdc++ provides, e.g. GLIBCXX_3.4.30.
glibcxx_max() { grep -a -o 'GLIBCXX_3\.4\.[0-9]*' "$1" 2>/dev/null | sort -u -V | tail -1; }

# Compiles python/src/*.cpp against $PYTHON's headers and pybind11, links the carried archives
# and shared libraries, and lays the package out in build-py/ (PYTHONPATH=build-py).
build_python_module() {
  local py="$1" work=build-py cxx="${CXX:-$(command -v g++ || command -v c++)}"
  local cuda_home="${CUDA_HOME:-/usr/local/cuda}"
  local includes ext defs="" objs=() archives=() src
  rm -rf "$work" && mkdir -p "$work/lockstep" "$work/obj" "$work/libs"
  # pybind11's own answer; Debian's pybind11-dev has no Python module (headers in /usr/include).
  includes=$("$py" -m pybind11 --includes 2>/dev/null) ||
    includes="-I$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') -I/usr/include"
  ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  [ -f "$DIST/pylib/liblockstep_kernels.a" ] && defs="-DLOCKSTEP_HAVE_CUDA"
  echo "compiler: $("$cxx" --version | head -1); python: $("$py" --version); includes: $includes"
  local pids=() pid
  for src in python/src/*.cpp; do  # in parallel: one compiler per translation unit
    local obj="$work/obj/$(basename "$src" .cpp).o"
    # shellcheck disable=SC2086
    "$cxx" -std=c++20 -O2 -fPIC -fvisibility=hidden $defs $includes -I. -I"$DIST/include" \
        -c "$src" -o "$obj" &
    pids+=($!)
    objs+=("$obj")
  done
  for pid in "${pids[@]}"; do wait "$pid" || return 1; done
  for a in $PY_ARCHIVES; do
    [ -f "$DIST/pylib/lib$a.a" ] && archives+=("$DIST/pylib/lib$a.a")
  done
  # The carried shared libraries the archives need, beside the module. This toolchain's
  # libstdc++/libgcc_s only where they are newer than the host compiler's (the newer one serves
  # both: the archives were built here, the bindings there).
  for lib in libfmt.so.9 libxxhash.so.0 libcapnp-0.9.2.so libkj-0.9.2.so; do
    ln -s "$(realpath "$DIST")/lib/$lib" "$work/libs/$lib"
  done
  local ours host
  ours=$(glibcxx_max "$DIST/lib/libstdc++.so.6")
  host=$(glibcxx_max "$(readlink -f "$("$cxx" -print-file-name=libstdc++.so.6)")")
  if [ "$(printf '%s\n%s\n' "$ours" "$host" | sort -V | tail -1)" = "$ours" ] && [ "$ours" != "$host" ]; then
    ln -s "$(realpath "$DIST")/lib/libstdc++.so.6" "$work/libs/libstdc++.so.6"
    ln -s "$(realpath "$DIST")/lib/libgcc_s.so.1" "$work/libs/libgcc_s.so.1"
    ln -s "$(realpath "$DIST")/lib/libstdc++.so.6" "$work/libs/libstdc++.so"
    echo "libstdc++: the carried one ($ours; the host compiler's has $host)"
  else
    echo "libstdc++: the host's ($host; the carried one has $ours)"
  fi
  local cuda_libs=()
  # cuBLAS is loaded by the archives' kernels/cublas_loader.cpp at first use (dlopen by soname):
  # the rpath lets it find the host's.
  [ -n "$defs" ] && cuda_libs=("$DIST/pylib/libcudart_static.a" -ldl -Wl,-rpath,"$cuda_home/lib64")
  # shellcheck disable=SC2016
  "$cxx" -shared -o "$work/lockstep/_lockstep$ext" "${objs[@]}" -L"$work/libs" \
      -Wl,--start-group "${archives[@]}" -Wl,--end-group \
      "$work/libs/libfmt.so.9" "$work/libs/libxxhash.so.0" "$work/libs/libcapnp-0.9.2.so" \
      "$work/libs/libkj-0.9.2.so" "${cuda_libs[@]}" -lpthread -ldl -lrt \
      -Wl,-rpath,'$ORIGIN/../libs' || return 1
  cp python/lockstep/*.py "$work/lockstep/"
  LD_LIBRARY_PATH="$PWD/$work/libs" ldd "$work/lockstep/_lockstep$ext" | grep -v -E 'linux-vdso|ld-linux'
}

run_python() {
  OUT="${OUT:-out/gpu-run}"
  mkdir -p "$OUT"
  local py="${PYTHON:-python3}" status=0
  if [ ! -f "$DIST/pylib/liblockstep_core.a" ]; then
    echo "gpu-run: $DIST/pylib is missing: run 'scripts/gpu-run.sh package' here and carry $DIST" >&2
    exit 2
  fi
  echo "== build the module against $py"
  build_python_module "$py" > "$OUT/python_build.log" 2>&1 || status=1
  tail -12 "$OUT/python_build.log"
  [ $status -eq 0 ] || { echo "gpu-run python: the module did not build (see python_build.log)"; return 1; }
  export LD_LIBRARY_PATH="$PWD/build-py/libs" PYTHONPATH="$PWD/build-py"
  export LOCKSTEP_BIN="$(realpath "$DIST")/bin/lockstep" LOCKSTEP_SOURCE_DIR="$PWD"
  echo "== python tests (backend cpu and cuda)"
  run_part --new "$OUT/python_tests.log" 300 \
      "$py" -m pytest -q -rs -p no:cacheprovider python/tests --junitxml="$OUT/python_tests.xml"
  tail -15 "$OUT/python_tests.log"
  echo "== Python engine loop against the C++ serving loop (llama-1b, CUDA)"
  run_part --new "$OUT/python_loop.log" 200 "$py" bench/python_loop.py --lockstep "$LOCKSTEP_BIN" \
      --model llama-1b --backend cuda --batch 16 --new-tokens 64 --json "$OUT/python_loop.json" &&
    run_part "$OUT/python_loop.log" 60 "$py" bench/python_loop.py --lockstep "$LOCKSTEP_BIN" \
        --model tiny --backend cuda --batch 16 --new-tokens 64
  cat "$OUT/python_loop.log"
  mode_done python
  return $status
}

# The HF oracle over every fixture family (tests/fixtures/hf), appended to $1, figures merged into
# the JSON $2 (one entry per family). llama3-legacy has only its config.json: it runs on a
# directory assembled with llama3's weights and reference, as the CPU test does.
hf_fixtures() {
  local log="$1" json="$2" status=0 dir
  rm -rf /tmp/hf_fixtures && mkdir -p /tmp/hf_fixtures/llama3-legacy
  cp tests/fixtures/hf/llama3-legacy/config.json /tmp/hf_fixtures/llama3-legacy/
  ln -s "$PWD/tests/fixtures/hf/llama3/model.safetensors" "$PWD/tests/fixtures/hf/llama3/hf_reference.json" \
      /tmp/hf_fixtures/llama3-legacy/
  for dir in tests/fixtures/hf/llama3 /tmp/hf_fixtures/llama3-legacy tests/fixtures/hf/llama-linear \
             tests/fixtures/hf/qwen2 tests/fixtures/hf/qwen3 tests/fixtures/hf/mistral \
             tests/fixtures/hf/bamba; do
    echo "== HF fixture $dir" >> "$log"
    run_part "$log" 60 "$DIST/bin/lockstep_hf_oracle_check" "$dir" "/tmp/hf_fixtures/$(basename "$dir").json"
  done
  grep -E "^== HF fixture|vs HF|hf oracle: (PASS|FAIL)|error" "$log" | tail -30
  env -u LD_LIBRARY_PATH python3 - "$json" /tmp/hf_fixtures/*.json <<'PY' 2>&1 | tee -a "$log"
import json, os, sys
out = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {}
out["fixtures"] = {}
for path in sys.argv[2:]:
    try:
        out["fixtures"][os.path.basename(path)[:-5]] = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"hf fixtures: {path}: {e}")
out["fixtures_pass"] = bool(out["fixtures"]) and all(f.get("pass") for f in out["fixtures"].values())
json.dump(out, open(sys.argv[1], "w"), indent=2)
print(f"hf fixtures: {len(out['fixtures'])} families, all pass: {out['fixtures_pass']}")
PY
  return $status
}

run_families() {
  begin_mode lockstep_hf_oracle_check
  local status=0
  echo "== layer-op and backend GPU tests"
  run_gpu_tests 'OddSizes/TokenCounts.*:CudaFamilies.*:GraphsOffOn/TinyGreedy.*:CudaDeterminism.*' 120
  echo "== HF fixtures on CUDA fp32 and bf16 (and the CPU reference)"
  hf_fixtures "$OUT/hf_oracle.log" "$OUT/hf_oracle.json" || status=1
  echo "== benchmark: qwen3-0.6b and qwen2.5-7b"
  run_part --new "$OUT/gpu_bench.log" 200 \
      "$DIST/bin/lockstep_gpu_bench" "$OUT/gpu_bench.json" --shapes qwen3-0.6b,qwen2.5-7b
  cat "$OUT/gpu_bench.log"
  mode_done families
  return $status
}

# Speculative decoding on CUDA through the CLI, appended to $1: generate with W = 4 and the
# n-gram drafter, recorded and replayed exactly on CUDA (the drafter rebuilt from the header);
# then the simulator's world on the CUDA backend over 20 seeds (checkers and twin runs).
spec_cli() {
  local log="$1" status=0
  echo "== CLI on CUDA, speculative: generate --verify-width 4 --drafter ngram --record, replay --backend cuda" >> "$log"
  run_part "$log" 30 "$DIST/bin/lockstep" generate --prompts examples/prompts.jsonl --backend cuda \
      --verify-width 4 --drafter ngram --record /tmp/cli_cuda_spec.trace -o /tmp/cli_cuda_spec.jsonl &&
    run_part "$log" 30 "$DIST/bin/lockstep" replay /tmp/cli_cuda_spec.trace --backend cuda -q &&
    { "$DIST/bin/lockstep" trace inspect /tmp/cli_cuda_spec.trace | grep -E "drafter" | head -2; } >> "$log" 2>&1 ||
    status=1
  echo "== sim on CUDA: lockstep sim --backend cuda --seeds 1..20" >> "$log"
  run_part "$log" 90 "$DIST/bin/lockstep" sim --backend cuda --seeds 1..20
  # Speculative mode over 20 seeds (W 2..8 drawn per seed), the n-gram drafter on every seed
  # (oracle-mix is CPU-only).
  echo "== sim on CUDA: lockstep sim --backend cuda --spec --drafter ngram --seeds 1..20" >> "$log"
  run_part "$log" 120 "$DIST/bin/lockstep" sim --backend cuda --spec --drafter ngram --seeds 1..20
  grep -E "IDENTICAL|DIVERGED|drafter|^1\.\.20|checkers|twin run|FAILED|error" "$log" | tail -14
  return $status
}

# `lockstep report` of a trace recorded on CUDA (llama-1b, random weights): 64 prompts (seeded, 16 to 256 tokens, 32 to 192
# new tokens), W = 4 with the device n-gram drafter, replayed exactly on CUDA; the page, its JSON,
# the replay's JSON and the log go into one file, $1 (a tar), so the run keeps to 8 files.
cuda_report() {
  local tar="$1" dir=/tmp/cuda_report status=0
  rm -rf "$dir" && mkdir -p "$dir"
  env -u LD_LIBRARY_PATH python3 - "$dir/prompts.jsonl" <<'PY'
import json, random, sys
r = random.Random(17)
with open(sys.argv[1], "w") as f:
    for i in range(64):
        prompt = [r.randrange(3, 500) for _ in range(r.randrange(16, 257))]
        f.write(json.dumps({"id": 1000 + i, "prompt": prompt, "max_new_tokens": r.randrange(32, 193)}) + "\n")
PY
  echo "== report of a CUDA trace: generate --backend cuda --verify-width 4 --drafter ngram --record" \
      > "$dir/report.log"
  run_part "$dir/report.log" 60 "$DIST/bin/lockstep" generate --model llama-1b --prompts "$dir/prompts.jsonl" \
      --backend cuda --verify-width 4 --drafter ngram --record "$dir/cuda.trace" -o "$dir/out.jsonl" -q
  # A replay that diverges still gets its report: the page shows where.
  run_part "$dir/report.log" 60 \
      "$DIST/bin/lockstep" replay "$dir/cuda.trace" --backend cuda -q --json "$dir/replay.json"
  local replayed=()
  [ -s "$dir/replay.json" ] && replayed=(--replay-json "$dir/replay.json")
  {
    "$DIST/bin/lockstep" report "$dir/cuda.trace" -o "$dir/report.html" --json "$dir/report.json" "${replayed[@]}" &&
    env -u LD_LIBRARY_PATH python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); [print(k, json.dumps(d[k])) for k in ("step_latency", "requests", "accept", "replay")]' "$dir/report.json"
  } >> "$dir/report.log" 2>&1 || status=1
  tail -6 "$dir/report.log"
  tar -C "$dir" -cf "$tar" report.log $(cd "$dir" && ls report.html report.json replay.json 2>/dev/null)
  return $status
}

run_report() {
  begin_mode lockstep
  local status=0
  cuda_report "$OUT/cuda_report.tar" || status=1
  mode_done report
  return $status
}

# The speculative-decoding benchmark: its log appended to $1, its JSON merged into $2 (when that
# file exists) under "speculative", else written there.
spec_bench() {
  local log="$1" json="$2" status=0
  echo "== speculative decoding benchmark (llama-1b, W 4 + ngram vs W 1)" | tee -a "$log"
  run_part "$log" 60 "$DIST/bin/lockstep_gpu_spec_bench" /tmp/gpu_spec_bench.json
  grep -E "batch|tokens/s" "$log" | tail -6
  env -u LD_LIBRARY_PATH python3 - "$json" /tmp/gpu_spec_bench.json <<'PY' 2>&1 | tee -a "$log"
import json, os, sys
try:
    spec = json.load(open(sys.argv[2]))
except (OSError, ValueError) as e:
    print(f"speculative: missing figures ({e})")
    sys.exit(0)
out = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {}
out["speculative"] = spec
json.dump(out, open(sys.argv[1], "w"), indent=2)
print(f"speculative: figures merged into {sys.argv[1]}")
PY
  return $status
}

run_spec() {
  begin_mode lockstep_gpu_spec_bench
  local status=0
  echo "== drafter GPU tests"
  run_part --new "$OUT/spec.log" 120 "$DIST/bin/lockstep_gpu_tests" \
      --gtest_filter='Widths/NgramKernel.*:CudaDrafterOptions.*:GraphsOffOn/CudaSpecInvariance.*:CudaDrafter.*:CudaStateOps.*' \
      --gtest_output="json:$OUT/spec_tests.json"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED TEST|NgramKernel W|spec invariance|drafts vs CPU' "$OUT/spec.log" | tail -30
  spec_cli "$OUT/spec.log" || status=1
  spec_bench "$OUT/spec.log" "$OUT/gpu_spec_bench.json" || status=1
  mode_done spec
  return $status
}

# The full run's checks: every GPU test, the CLI on CUDA, a CUDA trace's report, the sanitizer's
# subset, the HF oracle and fixtures. Sets status (the caller's local) to 1 on a failure.
run_checks() {
  {
    for b in "$DIST"/bin/*; do echo "== ldd $b"; ldd "$b"; done
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 || true
  } >> "$OUT/env.txt" 2>&1

  echo "== GPU tests"
  # llama-1b against the CPU reference (fp32, ~1 min of CPU) runs on its own, after the rest.
  run_part --new "$OUT/gpu_tests.log" 240 "$DIST/bin/lockstep_gpu_tests" \
      --gtest_filter='-CudaLlama1b.*:GraphsOffOn/CudaSpecInvariance.*:CudaDrafter.*' \
      --gtest_output="json:$OUT/gpu_tests.json"
  run_part "$OUT/gpu_tests.log" 100 "$DIST/bin/lockstep_gpu_tests" --gtest_filter='CudaLlama1b.*'
  # Speculative decoding against W = 1 and against the CPU's drafts (tiny, fp32; CPU-bound part).
  run_part "$OUT/gpu_tests.log" 90 "$DIST/bin/lockstep_gpu_tests" \
      --gtest_filter='GraphsOffOn/CudaSpecInvariance.*:CudaDrafter.*'
  # Tensor parallelism's GPU tests too, so "every GPU test" means every one: on a one-GPU host
  # both ranks run on GPU 0 (one rank a GPU where there are two); ~10 s. The tp mode adds the CLI
  # and the TP figures.
  echo "== TP GPU tests (lockstep_gpu_tp_tests)" >> "$OUT/gpu_tests.log"
  run_part "$OUT/gpu_tests.log" 120 env "${TP_ENV[@]}" "$DIST/bin/lockstep_gpu_tp_tests"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED TEST|greedy|swap,|llama-1b|determinism|NgramKernel W|spec invariance|drafts vs CPU' "$OUT/gpu_tests.log" | tail -56

  echo "== CLI on CUDA: generate --backend cuda --record, replay --backend cuda (exact), inspect"
  echo "== CLI on CUDA" >> "$OUT/gpu_tests.log"
  run_part "$OUT/gpu_tests.log" 30 "$DIST/bin/lockstep" generate --prompts examples/prompts.jsonl \
      --backend cuda --record /tmp/cli_cuda.trace -o /tmp/cli_cuda.jsonl &&
    run_part "$OUT/gpu_tests.log" 30 "$DIST/bin/lockstep" replay /tmp/cli_cuda.trace --backend cuda -q
  {
    timeout 30 "$DIST/bin/lockstep" replay /tmp/cli_cuda.trace --mode teacher-forced -q
    "$DIST/bin/lockstep" trace inspect /tmp/cli_cuda.trace | head -5
  } >> "$OUT/gpu_tests.log" 2>&1
  grep -E "IDENTICAL|DIVERGED|agreement|SMs|error" "$OUT/gpu_tests.log" | tail -6
  spec_cli "$OUT/gpu_tests.log" || status=1
  echo "== report of a CUDA trace (cuda_report.tar)"
  cuda_report "$OUT/cuda_report.tar" || status=1

  if command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    echo "== compute-sanitizer memcheck (subset)"
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 45 "$SAN" --tool memcheck --print-limit 20 "$DIST/bin/lockstep_gpu_tests" \
        --gtest_filter='CudaStateOps.VerifyWidthThreeLikeTheCpu:OddSizes/PrefillChunk.*/1:OddBatches/DecodeBatch.*/1:AttentionFp32.*:OddBatches/GemvTokens.*/1:OddBatches/LogitsRows.*/1:OddBatches/SampleRows.*/2:OddBatches/VerifyRows.*/2' \
        > /tmp/sanitizer.log 2>&1 || echo "(sanitizer exit $?: informational; it may not work under gVisor)"
    tail -5 /tmp/sanitizer.log
    { echo "== compute-sanitizer memcheck (subset)"; cat /tmp/sanitizer.log; } >> "$OUT/gpu_tests.log"
  fi

  if [ -x "$DIST/bin/lockstep_hf_oracle_check" ] && [ -f tests/hf_oracle.py ]; then
    echo "== HF oracle"
    rm -rf /tmp/hf_oracle
    run_part --new "$OUT/hf_oracle.log" 150 \
        env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 tests/hf_oracle.py --out-dir /tmp/hf_oracle &&
      run_part "$OUT/hf_oracle.log" 45 "$DIST/bin/lockstep_hf_oracle_check" /tmp/hf_oracle "$OUT/hf_oracle.json"
    tail -8 "$OUT/hf_oracle.log"
  fi
  if [ -x "$DIST/bin/lockstep_hf_oracle_check" ]; then
    echo "== HF fixtures (tests/fixtures/hf) on CUDA fp32 and bf16"
    hf_fixtures "$OUT/hf_oracle.log" "$OUT/hf_oracle.json" || status=1
  fi
}

# The full run's figures: the benchmark, speculative decoding, paged attention alone, the PyTorch
# peer and HF generate side by side.
run_benchmarks() {
  echo "== benchmark"
  run_part --new "$OUT/gpu_bench.log" 360 "$DIST/bin/lockstep_gpu_bench" "$OUT/gpu_bench.json"
  cat "$OUT/gpu_bench.log"
  spec_bench "$OUT/gpu_bench.log" "$OUT/gpu_bench.json" || status=1
  echo "== paged attention alone (lockstep_gpu_attention_bench)" | tee -a "$OUT/gpu_bench.log"
  run_part --show "$OUT/gpu_bench.log" 30 "$DIST/bin/lockstep_gpu_attention_bench"

  echo "== PyTorch peer (one CUDA graph per step) and HF generate"
  run_part --show "$OUT/gpu_bench.log" 90 env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
      TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python3 bench/torch_peer.py --json /tmp/torch_peer.json
  # HF generate on its own clock: it starts no case after 75 s.
  run_part --show "$OUT/gpu_bench.log" 120 env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 \
      python3 bench/torch_peer.py --json /tmp/hf_generate.json --hf-only --hf-budget-s 75
  env -u LD_LIBRARY_PATH python3 - "$OUT/gpu_bench.json" /tmp/torch_peer.json /tmp/hf_generate.json <<'PY' 2>&1 | tee -a "$OUT/gpu_bench.log"
import json, sys
try:
    bench = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))
except (OSError, ValueError) as e:
    print(f"side by side: missing figures ({e})")
    sys.exit(0)
try:
    peer["hf_generate"] = json.load(open(sys.argv[3])).get("hf_generate", [])
except (OSError, ValueError) as e:
    print(f"HF generate: missing figures ({e})")
bench["peer"] = peer
json.dump(bench, open(sys.argv[1], "w"), indent=2)
mine = {(s["shape"], d["batch"], d["context"]): d for s in bench.get("shapes", []) for d in s["decode"]}
bw = bench["copy_bandwidth_bytes_per_s"]
print(f"side by side, decode step (graphs), copy bandwidth {bw * 1e-12:.2f} TB/s (lockstep's probe):")
print(f"  {'shape':9} {'batch':>5} {'ctx':>5} {'lockstep ms':>12} {'torch ms':>9} {'torch/lockstep':>15} {'lockstep %BW':>13} {'torch %BW':>10}")
for p in peer.get("decode", []):
    k = (p["shape"], p["batch"], p["context"])
    if k not in mine:
        continue
    m = mine[k]
    tf = p["bytes_moved"] / (p["step_ms_median"] * 1e-3) / bw
    print(f"  {k[0]:9} {k[1]:5d} {k[2]:5d} {m['step_ms_median']:12.3f} {p['step_ms_median']:9.3f} "
          f"{p['step_ms_median'] / m['step_ms_median']:15.2f} {100 * m['bandwidth_fraction']:12.1f}% {100 * tf:9.1f}%")
for h in peer.get("hf_generate", []):
    k = (h["shape"], h["batch"], h["context"])
    vs = f", {h['step_ms'] / mine[k]['step_ms_median']:.1f}x lockstep's step" if k in mine else ""
    print(f"  HF generate {h['shape']} batch {h['batch']} context {h['context']}: {h['step_ms']:.2f} ms/token{vs}")
PY
}

run() {
  begin_mode lockstep_gpu_tests
  local status=0
  run_checks
  run_benchmarks
  mode_done
  return $status
}

# The full run's checks alone (no figures): what a change needs before it merges, ~3 min.
run_tests() {
  begin_mode lockstep_gpu_tests
  local status=0
  run_checks
  mode_done tests
  return $status
}

run_recording() {
  begin_mode lockstep_gpu_bench
  local status=0 log="$OUT/recording_tests.log" trace=/tmp/gpu_run_recording.trace
  run_part --new "$log" 150 "$DIST/bin/lockstep_gpu_tests" \
      --gtest_filter='OddVocabularies/RecordKernel.*:Vocabularies/RecordKernelAdversarial.*:CudaRecord.*:CudaDeterminism.*'
  echo "== CLI on CUDA: generate --record, replay --backend cuda, replay teacher-forced (CPU), check" >> "$log"
  run_part "$log" 40 "$DIST/bin/lockstep" generate --prompts examples/prompts.jsonl --backend cuda \
      --record "$trace" -o /tmp/gpu_run_recording.jsonl -q && echo "generate rc=0" >> "$log"
  run_part "$log" 40 "$DIST/bin/lockstep" replay "$trace" --backend cuda -q
  # The agreement only: teacher-forced on the CPU is informational here.
  timeout 60 "$DIST/bin/lockstep" replay "$trace" --mode teacher-forced -q >> "$log" 2>&1
  run_part "$log" 30 "$DIST/bin/lockstep" check "$trace"
  grep -E '^\[  (PASSED|FAILED) |FAILED TEST|determinism:|cuda record:|IDENTICAL|agreement|invariant|VIOLATION' "$log" | tail -20
  run_part --new "$OUT/recording_bench.log" 300 \
      "$DIST/bin/lockstep_gpu_bench" "$OUT/recording_bench.json" --recording
  # The CPU reference's recording cost too, on this host's idle cores (the benchmark's own
  # Google Benchmark figures; the generate workload five times).
  {
    echo "== CPU: lockstep_bench_recording ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
    for i in 1 2 3 4 5; do
      timeout 60 "$DIST/bin/lockstep_bench_recording" --benchmark_filter=Generate 2>&1 |
          grep -E '^generate|of which|CPU time'
    done
    timeout 120 "$DIST/bin/lockstep_bench_recording" --benchmark_filter='Row' 2>&1 | grep -E '^BM_'
  } >> "$OUT/recording_bench.log" 2>&1 || status=1
  cat "$OUT/recording_bench.log"
  mode_done recording
  return $status
}

# Tensor parallelism (issue 18): the TP tests on every placement this host has, the NCCL block's
# tests, the CLI at --tp 2 on CUDA (record, exact replay at TP 2, teacher-forced at TP 1), and the
# TP decode benchmark. NVLink multicast stays off (the collectives pin NCCL_NVLS_ENABLE=0).
run_tp() {
  begin_mode lockstep_gpu_tp_tests
  local status=0
  export "${TP_ENV[@]}"
  echo "== TP GPU tests"
  local log="$OUT/tp_tests.log"
  run_part --new "$log" 300 "$DIST/bin/lockstep_gpu_tp_tests" --gtest_output="json:$OUT/tp_tests.json"
  run_part "$log" 60 "$DIST/bin/lockstep_gpu_tests" --gtest_filter='NcclComm.*'
  echo "== CLI on CUDA at TP 2: generate --record, replay exact at TP 2, teacher-forced at TP 1" >> "$log"
  run_part "$log" 60 "$DIST/bin/lockstep" generate --prompts examples/prompts.jsonl --backend cuda --tp 2 \
      --record /tmp/cli_cuda_tp2.trace -o /tmp/cli_cuda_tp2.jsonl &&
    { "$DIST/bin/lockstep" trace inspect /tmp/cli_cuda_tp2.trace | grep -E "TP|collectives"; } >> "$log" 2>&1 &&
    run_part "$log" 60 "$DIST/bin/lockstep" replay /tmp/cli_cuda_tp2.trace --backend cuda -q &&
    run_part "$log" 60 "$DIST/bin/lockstep" replay /tmp/cli_cuda_tp2.trace --backend cuda --tp 1 \
        --mode teacher-forced -q ||
    status=1
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED TEST|TP 2 vs TP 1|exact replay at TP|IDENTICAL|DIVERGED|agreement|collectives' \
      "$log" | tail -30
  run_part --new "$OUT/tp_bench.log" 300 "$DIST/bin/lockstep_gpu_bench" "$OUT/tp_bench.json" --tp 2
  cat "$OUT/tp_bench.log"
  mode_done tp
  return $status
}

run_hybrid() {
  begin_mode lockstep_hf_oracle_check
  local status=0
  echo "== hybrid GPU tests"
  local tests="$OUT/hybrid_tests.log" bench="$OUT/hybrid_bench.log"
  run_part --new "$tests" 200 "$DIST/bin/lockstep_gpu_tests" \
      --gtest_filter='OddSizes/TokenCounts.*Rope*:MambaMixerGpu.*:MambaPoolGpu.*:MambaChunkedScanGpu.*:HybridChunkedPrefill.*:GraphsOffOn/HybridServed.*:HybridRules.*:HybridDeterminism.*:HybridMemory.*:HybridRecord.*:HybridSwap.*:HybridRefusals.*:HybridSimGpu.*' \
      --gtest_output="json:$OUT/hybrid_tests.json"
  echo "== HF fixture tests/fixtures/hf/bamba" >> "$tests"
  run_part "$tests" 60 "$DIST/bin/lockstep_hf_oracle_check" tests/fixtures/hf/bamba /tmp/hf_bamba.json
  echo "== CLI on CUDA, a hybrid: generate --backend cuda --record, replay --backend cuda (exact)" >> "$tests"
  run_part "$tests" 60 "$DIST/bin/lockstep" generate --model tests/fixtures/hf/bamba \
      --prompts examples/prompts.jsonl --backend cuda --record /tmp/cli_cuda_bamba.trace \
      -o /tmp/cli_cuda_bamba.jsonl &&
    run_part "$tests" 60 "$DIST/bin/lockstep" replay /tmp/cli_cuda_bamba.trace --backend cuda
  echo "== sim on CUDA: lockstep sim --model tiny-hybrid --backend cuda --seeds 1..4 --faults all" >> "$tests"
  run_part "$tests" 90 "$DIST/bin/lockstep" sim --model tiny-hybrid --backend cuda --seeds 1..4 --faults all
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |FAILED TEST|hybrid, CUDA|chunked|vs HF|hf oracle: (PASS|FAIL)|IDENTICAL|DIVERGED|error|hybrid swap|swap retraction|hybrid sim|^1\.\.4 ' \
      "$tests" | tail -30
  echo "== benchmark: bamba-9b decode at batch 1 and 64"
  run_part --new "$bench" 330 "$DIST/bin/lockstep_gpu_bench" "$OUT/hybrid_bench.json" --hybrid
  echo "== one Bamba-9B mixer layer alone (lockstep_gpu_mamba_bench)" >> "$bench"
  run_part "$bench" 120 "$DIST/bin/lockstep_gpu_mamba_bench"
  cat "$bench"
  mode_done hybrid
  return $status
}

# The decode GEMV's fused forms (issue 14): their bit-for-bit tests against the unfused kernels
# (llama-1b and llama-8b layer shapes, tokens 1..8), the GEMV and layer-op tests, the backend
# tests and the determinism test (its trace replayed exactly with and without fusion), the HF
# fixtures (Qwen's biases and head norms, Bamba's partial rotary take the partly fused path), then
# `lockstep_gpu_bench --fusion` (llama-1b and llama-8b, batch 1, 4, 8, context 1024), ~4 min.
run_fusion() {
  begin_mode lockstep_gpu_bench
  local status=0
  echo "== decode fusion, layer-op and backend GPU tests"
  run_gpu_tests 'Layers/FusionShapes.*:DecodeFusion.*:CudaDecodeFusion.*:OddBatches/GemvTokens.*:OddSizes/TokenCounts.*:CudaFamilies.*:GraphsOffOn/TinyGreedy.*:CudaDeterminism.*:*HybridServed.*:HybridDeterminism.*' \
      240 determinism
  if [ -x "$DIST/bin/lockstep_hf_oracle_check" ]; then
    echo "== HF fixtures on CUDA fp32 and bf16 (and the CPU reference)"
    hf_fixtures "$OUT/hf_oracle.log" "$OUT/hf_oracle.json" || status=1
  fi
  echo "== benchmark: fused vs unfused decode"
  run_part --new "$OUT/fusion_bench.log" 300 "$DIST/bin/lockstep_gpu_bench" \
      "$OUT/fusion_bench.json" --fusion
  cat "$OUT/fusion_bench.log"
  mode_done fusion
  return $status
}

# The device sampler (kernels/sampling_ops.cu) against the CPU definition (core/sampling.cpp):
# tokens, verify and every weight's bits; then what sampled rows cost a decode step against
# greedy ones (`lockstep_gpu_bench --sampling`), ~3 min.
run_sampling() {
  begin_mode lockstep_gpu_bench
  local status=0
  echo "== sampler GPU tests"
  run_gpu_tests '*SampleRows*:*VerifyRows*:SamplingWeights.*:*Sampling*' 120
  echo "== benchmark: sampled vs greedy decode"
  run_part --new "$OUT/sampling_bench.log" 300 "$DIST/bin/lockstep_gpu_bench" \
      "$OUT/sampling_bench.json" --sampling
  cat "$OUT/sampling_bench.log"
  mode_done sampling
  return $status
}

# Nsight Compute over decode attention at batch 64, context 1024, llama-1b's heads then llama-8b's
# (gpu-libs.sh ncu_attention): details in attention_ncu.log, SASS stall tables in
# attention_sass_<model>.csv. The profiles of 2f7fded and 6fd9cf0 ran before `--clock-control
# none`, so locked to base clocks (~1.37 GHz).
run_attention_profile() {
  begin_mode lockstep_gpu_attention_bench
  local status=0 model
  : > "$OUT/attention_ncu.log"
  for model in llama-1b llama-8b; do
    ncu_attention "$DIST/bin/lockstep_gpu_attention_bench" "$model" "$OUT/attention_ncu.log" \
        "$OUT/attention_sass_$model.csv" || status=1
  done
  grep -E "^== |attention_mma_kernel|DRAM Throughput|Duration|Achieved Occupancy|Memory Throughput" \
      "$OUT/attention_ncu.log"
  return $status
}

# A command of one's own against the package (a test filter, one bench flag): `gpu-run.sh exec
# lockstep_gpu_tests --gtest_filter=...` runs it with the package's binaries on PATH and its
# libraries found.
run_exec() {
  begin_mode "$1"
  PATH="$(realpath "$DIST")/bin:$PATH" "$@"
}

case "${1:-run}" in
  package) package ;;
  exec) shift; run_exec "$@" ;;
  run) run ;;
  tests) run_tests ;;
  spec) run_spec ;;
  families) run_families ;;
  python) run_python ;;
  recording) run_recording ;;
  pack-python) pack_python "${2:-build-gpu}" ;;
  report) run_report ;;
  tp) run_tp ;;
  hybrid) run_hybrid ;;
  fusion) run_fusion ;;
  sampling) run_sampling ;;
  attention-profile) run_attention_profile ;;
  *) echo "usage: scripts/gpu-run.sh [package|run|tests|spec|families|report|python|recording|tp|hybrid|fusion|sampling|attention-profile|pack-python [BUILD_DIR]|exec CMD [ARGS]]" >&2; exit 2 ;;
esac
