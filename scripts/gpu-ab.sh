#!/usr/bin/env bash
# A change's GPU figures with and without it, in one H200 run: two builds' benchmarks alternating
# (old, new, old, new, ...), so the machine's drift falls on both alike, then the new build's GPU
# tests. What the README quotes as "A against B, alternating, one run" comes from here.
#
#   scripts/gpu-ab.sh package OLD NEW [NEW2 [NEW3]]
#                                       # here (no GPU needed): build the commits' GPU binaries in
#                                       # git worktrees under build-ab/src (ccache when there), and
#                                       # pack stripped, gzipped copies with the shared libraries
#                                       # the H200 host lacks into build-ab/dist (~27 MB, ~43 with
#                                       # NEW2, ~59 with NEW3: carry it; refused when it and the
#                                       # working tree (~16 MB) pass the device's 64 MiB a call);
#                                       # NEW2 and NEW3, more candidates, alternate with the
#                                       # others in `run` (old, new, new2, new3, old, ...)
#   scripts/gpu-ab.sh run ROUNDS BENCH [ARGS...]
#                                       # on the H200: the new build's lockstep_gpu_tests, then
#                                       # BENCH (lockstep_gpu_bench or lockstep_gpu_attention_bench,
#                                       # or the CLI, lockstep) with ARGS, ROUNDS times for each
#                                       # build, alternating, each run's whole-process time after
#                                       # it ("(wall S s)"); an
#                                       # argument `@json` becomes a JSON path under $OUT per run;
#                                       # each run limited to AB_RUN_SECONDS (240);
#                                       # AB_TESTS=skip leaves the tests out (a diagnostic
#                                       # run: ~100 s less; no merge on its figures alone),
#                                       # AB_TESTS=new2 (or new3) runs that build's instead,
#                                       # AB_TESTS=new,new2 each named build's (~100 s each).
#                                       # The runs' JSON end up in $OUT/bench-json.tgz (the
#                                       # device returns 8 files at most).
#                                       # AB_CROSS=MODEL (e.g. llama-1b; llama-1b,llama-8b
#                                       # checks both head dims) adds, after the tests and
#                                       # before the benchmark runs (a run cut short keeps
#                                       # both gates), the bits check of a kernel change: the
#                                       # old build records MODEL in batch-invariant mode on
#                                       # CUDA (every prompt of examples/prompts.jsonl; the
#                                       # first alone), and each candidate replays both traces
#                                       # exactly, the batch one whole and its request 1
#                                       # --isolate'd ($OUT/cross.log; a replay that differs
#                                       # fails the run; it prints how long it took). Its
#                                       # commands (a process, its weights and graphs): 2 a
#                                       # model, plus 3 a model and candidate; llama-1b,llama-8b
#                                       # with two candidates took 7.3 min on an H100 before the
#                                       # host's seeded weights got faster (2dc8b36), ~2.8 min
#                                       # after (2026-12-07), where a --decode benchmark run
#                                       # takes ~10 s.
#                                       # AB_PROFILE=MODEL (llama-1b or llama-8b) ends it with
#                                       # Nsight Compute over every build's decode attention at
#                                       # MODEL's batch 64, context 1024 (gpu-libs.sh
#                                       # ncu_attention; BENCH need not be the attention bench):
#                                       # $OUT/profile.log, $OUT/profile_sass_<side>.csv; ~1 min
#                                       # a build.
#                                       # AB_PLANTED=COMMIT (package) adds that commit's
#                                       # lockstep_gpu_tests alone (~4.5 MB): a candidate with a
#                                       # bug planted on purpose. `run` then needs
#                                       # AB_PLANTED_FILTER, a gtest filter, and runs those tests
#                                       # of it first: they must fail, else the run fails
#                                       # ($OUT/planted_gpu_tests.log; ~20 s).
#                                       # AB_DIR (default build-ab; build* is ignored by git) is
#                                       # where both modes keep the worktrees and dist: two
#                                       # packages made ahead of a device call (carry the one run).
#                                       # Writes $OUT/ab.log (every commit, every run's output)
#                                       # and $OUT/SIDE_gpu_tests.log; exits 1 when the tests or a
#                                       # benchmark run failed.
#
# Example (the SwiGLU epilogue's cost in batch-invariant mode):
#   scripts/gpu-ab.sh package 936dc99 69777da       # here, then on the device with build-ab/dist:
#   scripts/gpu-ab.sh run 2 lockstep_gpu_bench @json --invariant
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
AB=${AB_DIR:-build-ab}
DIST=$AB/dist
BENCHES="lockstep_gpu_bench lockstep_gpu_attention_bench"
BINARIES="$BENCHES lockstep_gpu_tests lockstep lockstep_planted_cuda"
# shellcheck source=scripts/gpu-libs.sh
. scripts/gpu-libs.sh

# Builds commit $2's binaries in worktree $AB/src/$1 and packs them into $DIST/$1.
build_one() {
  local side="$1" commit="$2" tree="$AB/src/$1"
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
  git worktree add --detach "$tree" "$commit" >/dev/null || return 2
  cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a "${launcher[@]}" >/dev/null || return 2
  local targets=$BINARIES
  [ "$side" = planted ] && targets="lockstep_gpu_tests"
  # shellcheck disable=SC2086
  ninja -C "$tree/build" -j2 $targets || return 2
  mkdir -p "$DIST/$side"
  local binaries=$BINARIES
  # The old build's tests never run (a candidate's may); every build's CLI, for a trace one
  # records and another replays. A planted build only runs its tests.
  [ "$side" = old ] && binaries="$BENCHES lockstep"
  [ "$side" = planted ] && binaries="lockstep_gpu_tests"
  for b in $binaries; do
    find "$tree/build" -maxdepth 3 -type f -name "$b" -perm -u+x -exec cp {} "$DIST/$side/" \;
    [ -f "$DIST/$side/$b" ] || { echo "gpu-ab: $b not built for $commit" >&2; return 2; }
  done
  strip "$DIST/$side"/*
  gzip -f "$DIST/$side"/*
  git -C "$tree" rev-parse --short=12 HEAD > "$DIST/$side/commit.txt"
}

package() {
  if [ $# -lt 2 ] || [ $# -gt 4 ]; then
    echo "usage: scripts/gpu-ab.sh package OLD NEW [NEW2 [NEW3]] (two to four commits)" >&2
    exit 2
  fi
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  # The worktrees' sources hash alike (paths relative to the build folder): ccache hits.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
  rm -rf "$DIST" && mkdir -p "$DIST/lib"
  build_one old "$1" || exit 2
  build_one new "$2" || exit 2
  if [ $# -ge 3 ]; then build_one new2 "$3" || exit 2; fi
  if [ $# -ge 4 ]; then build_one new3 "$4" || exit 2; fi
  if [ -n "${AB_PLANTED:-}" ]; then build_one planted "$AB_PLANTED" || exit 2; fi
  for lib in $GPU_HOST_LACKS_LIBS; do cp -L "/lib/x86_64-linux-gnu/$lib" "$DIST/lib/"; done
  check_device_carry "$DIST" || exit 2
}

# One benchmark run of `side`, its output appended to ab.log; @json → $OUT/<bench>_<n>_<side>.json.
bench_once() {
  local side="$1" n="$2" bench="$3"
  shift 3
  local args=() a
  for a in "$@"; do
    if [ "$a" = @json ]; then args+=("$OUT/${bench}_${n}_${side}.json"); else args+=("$a"); fi
  done
  echo "== $bench $side ($(cat "$D/$side/commit.txt")), run $n" >> "$OUT/ab.log"
  local rc=0 start
  start=$(date +%s.%N)
  timeout "${AB_RUN_SECONDS:-240}" "$D/$side/$bench" "${args[@]}" >> "$OUT/ab.log" 2>&1 || rc=$?
  # The whole process's time: a start-up change (a CLI run as BENCH) is measured end to end.
  awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "(wall %.3f s)\n", b - a }' \
    >> "$OUT/ab.log"
  [ $rc -eq 0 ] || echo "(exit $rc)" >> "$OUT/ab.log"
  return $rc
}

run() {
  if [ $# -lt 2 ] || ! [ "$1" -ge 1 ] 2>/dev/null; then
    echo "usage: scripts/gpu-ab.sh run ROUNDS BENCH [ARGS...] (ROUNDS a positive count)" >&2
    exit 2
  fi
  local rounds="$1" bench="$2" tests="${AB_TESTS:-run}" t
  shift 2
  tests="${tests//,/ }"
  [ "$tests" = run ] && tests=new
  [ "$tests" = skip ] && tests=""
  for t in $tests; do
    case "$t" in
      new | new2 | new3) ;;
      *) echo "gpu-ab: AB_TESTS is '${AB_TESTS}': 'run' (the default: the new build's), 'skip'," \
              "or candidates among new, new2, new3 (e.g. new,new2)" >&2
         exit 2 ;;
    esac
  done
  OUT="${OUT:-out/gpu-ab}"
  mkdir -p "$OUT"
  D=$(realpath "$DIST")
  if [ ! -f "$D/new/$bench.gz" ] && [ ! -x "$D/new/$bench" ]; then
    echo "gpu-ab: $D/new has no $bench: run 'scripts/gpu-ab.sh package OLD NEW' here and carry $DIST" >&2
    exit 2
  fi
  local sides="old new"
  [ -d "$D/new2" ] && sides="$sides new2"
  [ -d "$D/new3" ] && sides="$sides new3"
  for t in $tests; do
    if [ ! -d "$D/$t" ]; then
      echo "gpu-ab: AB_TESTS names $t but $DIST has no $t build" >&2
      exit 2
    fi
  done
  if [ -d "$D/planted" ] && [ -z "${AB_PLANTED_FILTER:-}" ]; then
    echo "gpu-ab: $DIST has a planted build: AB_PLANTED_FILTER names the tests that must catch it" >&2
    exit 2
  fi
  local side
  for side in $sides $([ -d "$D/planted" ] && echo planted); do
    gunzip -f "$D/$side"/*.gz 2>/dev/null
    chmod +x "$D/$side"/lockstep*
  done
  export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  { for side in $sides; do printf '%s %s ' "$side" "$(cat "$D/$side/commit.txt")"; done; echo
    date -u; nvidia-smi -L; } \
    > "$OUT/ab.log" 2>&1
  # Only this run's JSON go into the archive: an $OUT once held an earlier run's (2026-12-06).
  rm -f "$OUT"/*_[0-9]*_{old,new,new2,new3}.json
  local status=0 rc
  if [ -d "$D/planted" ]; then
    rc=0
    timeout 240 "$D/planted/lockstep_gpu_tests" --gtest_filter="$AB_PLANTED_FILTER" \
      > "$OUT/planted_gpu_tests.log" 2>&1 || rc=$?
    if [ $rc -eq 0 ]; then
      echo "planted build ($(cat "$D/planted/commit.txt")): $AB_PLANTED_FILTER passed: the" \
           "tests did not catch the planted bug" >> "$OUT/ab.log"
      status=1
    else
      echo "planted build ($(cat "$D/planted/commit.txt")): $AB_PLANTED_FILTER failed" \
           "(exit $rc), as it must" >> "$OUT/ab.log"
    fi
    tail -1 "$OUT/ab.log"
  fi
  [ -n "$tests" ] || echo "GPU tests: skipped (AB_TESTS=skip)" >> "$OUT/ab.log"
  for t in $tests; do
    rc=0
    # The localisation tests run the CLI and the planted build from here.
    LOCKSTEP_BIN_DIR="$D/$t" timeout 240 "$D/$t/lockstep_gpu_tests" \
      > "$OUT/${t}_gpu_tests.log" 2>&1 || rc=$?
    echo "$t build's GPU tests: exit $rc" >> "$OUT/ab.log"
    [ $rc -eq 0 ] || status=1
    grep -E '^\[  (PASSED|FAILED) |FAILED TEST' "$OUT/${t}_gpu_tests.log" | tail -12
  done
  # The bits check before the figures: a run cut short by the device's limit still has both
  # of a merge's gates (the tests above and this).
  if [ -n "${AB_CROSS:-}" ]; then
    : > "$OUT/cross.log"
    local model cross_start=$SECONDS
    for model in ${AB_CROSS//,/ }; do
      cross_replay "$model" "$sides" || status=1
    done
    echo "the cross check took $((SECONDS - cross_start)) s" | tee -a "$OUT/cross.log" "$OUT/ab.log"
    grep -E '^==|IDENTICAL|DIVERGED|exit' "$OUT/cross.log"
  fi
  local n=0 r
  for ((r = 0; r < rounds; ++r)); do
    for side in $sides; do
      n=$((n + 1))
      bench_once "$side" "$n" "$bench" "$@" || status=1
    done
  done
  grep -E '^==|exit|wall|% step time|us/launch|graphs decode' "$OUT/ab.log"
  # The device returns at most 8 files: the runs' JSON travel as one archive.
  local jsons=("$OUT"/*.json)
  if [ -e "${jsons[0]}" ]; then
    tar czf "$OUT/bench-json.tgz" -C "$OUT" "${jsons[@]##*/}" && rm -f "${jsons[@]}"
  fi
  if [ -n "${AB_PROFILE:-}" ]; then
    profile_sides "$AB_PROFILE" "$sides" || status=1
    grep -E "^== |DRAM Throughput|Duration|Achieved Occupancy" "$OUT/profile.log"
  fi
  return $status
}

# AB_PROFILE: every build's decode attention for `model` under Nsight Compute (gpu-libs.sh
# ncu_attention), details into $OUT/profile.log, SASS stall tables into profile_sass_<side>.csv.
profile_sides() {
  local model="$1" sides="$2" status=0 side
  : > "$OUT/profile.log"
  for side in $sides; do
    echo "== $side $(cat "$D/$side/commit.txt")" >> "$OUT/profile.log"
    ncu_attention "$D/$side/lockstep_gpu_attention_bench" "$model" "$OUT/profile.log" \
        "$OUT/profile_sass_$side.csv" || status=1
  done
  return $status
}

# One command of the cross-build check, logged with its exit status; returns it.
cross_step() {
  local rc=0
  timeout 120 "$@" >> "$OUT/cross.log" 2>&1 || rc=$?
  echo "exit $rc" >> "$OUT/cross.log"
  return $rc
}

# AB_CROSS: traces of `model` recorded by the old build in batch-invariant mode, replayed exactly
# by every candidate in `sides` (whole, request 1 alone, and the one-prompt trace).
cross_replay() {
  local model="$1" sides="$2" status=0 side
  # Outside $OUT: a run cut short would otherwise return these in place of its logs (the device
  # returns 8 files at most).
  local work
  work=$(mktemp -d) || return 1
  local batch="$work/cross-batch.trace" one="$work/cross-one.trace" prompt="$work/cross-one.jsonl"
  head -1 examples/prompts.jsonl > "$prompt"
  echo "== old $(cat "$D/old/commit.txt"): generate $model --determinism invariant --record" \
    >> "$OUT/cross.log"
  local recorded=(generate --model "$model" --backend cuda --determinism invariant -q --record)
  cross_step "$D/old/lockstep" "${recorded[@]}" "$batch" --prompts examples/prompts.jsonl &&
    cross_step "$D/old/lockstep" "${recorded[@]}" "$one" --prompts "$prompt" || return 1
  for side in $sides; do
    [ "$side" = old ] && continue
    echo "== $side $(cat "$D/$side/commit.txt"): replay --backend cuda (whole, --isolate 1, one prompt)" \
      >> "$OUT/cross.log"
    cross_step "$D/$side/lockstep" replay "$batch" --backend cuda || status=1
    cross_step "$D/$side/lockstep" replay "$batch" --backend cuda --isolate 1 || status=1
    cross_step "$D/$side/lockstep" replay "$one" --backend cuda || status=1
  done
  rm -rf "$work"
  return $status
}

case "${1:-}" in
  package) shift; package "$@" ;;
  run) shift; run "$@" ;;
  *)
    echo "usage: scripts/gpu-ab.sh package OLD NEW [NEW2 [NEW3]] | run ROUNDS BENCH [ARGS...]" >&2
    exit 2
    ;;
esac
