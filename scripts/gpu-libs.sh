# shellcheck shell=bash
# Sourced by scripts/gpu-run.sh and scripts/gpu-ab.sh: what both need. The shared libraries a
# package carries because the H200 host lacks them (GPU.md): fmt, xxHash, Cap'n Proto and KJ (the
# trace replayed by the determinism test), and this toolchain's libstdc++/libgcc_s for libfmt.
# cuBLAS comes from the host (13.1).
# shellcheck disable=SC2034
GPU_HOST_LACKS_LIBS="libfmt.so.9 libxxhash.so.0 libstdc++.so.6 libgcc_s.so.1 libcapnp-0.9.2.so libkj-0.9.2.so"

# The launch of decode attention's tensor-core split kernel that `lockstep_gpu_attention_bench
# --iterations 5` makes fourth in a model's batch-64, context-1024 case (each case launches it 8
# times, 3 warm-up + 5, in the bench's order): llama-1b's heads 19, llama-8b's 99.
attention_launch_skip() {
  case "$1" in
    llama-1b) echo 19 ;;
    llama-8b) echo 99 ;;
    *) echo "gpu: no attention launch known for '$1' (llama-1b or llama-8b)" >&2; return 2 ;;
  esac
}

# Nsight Compute over that launch of `bench` (a lockstep_gpu_attention_bench) for `model`, at the
# card's own clocks (`--clock-control none`: ncu's default locks them to base, and the device's
# rules leave the card's clocks alone): `--set full`, its details page (throughput, occupancy, warp
# stall reasons) appended to `log`, its SASS with each instruction's executions and warp-stall
# samples by reason written to `csv` (the builds carry no -lineinfo: SASS, not source lines).
ncu_attention() {
  local bench="$1" model="$2" log="$3" csv="$4" skip
  local ncu="${NCU:-/usr/local/cuda/bin/ncu}" report="/tmp/attention-$$-$model"
  skip=$(attention_launch_skip "$model") || return 2
  [ -x "$ncu" ] || { echo "gpu: no Nsight Compute at $ncu (NCU=...)" >&2; return 2; }
  echo "== $model decode batch 64 context 1024: split kernel launch $skip of $bench" >> "$log"
  timeout 240 "$ncu" --clock-control none --set full -k regex:attention_mma_kernel \
      --launch-skip "$skip" --launch-count 1 -f -o "$report" "$bench" --iterations 5 \
      >> "$log" 2>&1 &&
    timeout 60 "$ncu" --import "$report.ncu-rep" --page details --print-details all \
      >> "$log" 2>&1 &&
    timeout 60 "$ncu" --import "$report.ncu-rep" --page source --csv --print-source sass \
      > "$csv" 2>&1
}

# Exit status 2, with a line saying by how much, when what a device call copies — the working tree
# (tracked files, and untracked ones git does not ignore) and the carried folder `$1` — passes the
# device's 64 MiB a call; otherwise a line with the total.
check_device_carry() {
  local dist="$1" tree_bytes dist_bytes
  tree_bytes=$({ git ls-files -z; git ls-files -z --others --exclude-standard; } |
               xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
  dist_bytes=$(du -sb "$dist" | cut -f1)
  local total=$((tree_bytes + dist_bytes)) mib=1048576
  if [ "$total" -gt $((64 * mib)) ]; then
    echo "gpu: the working tree ($((tree_bytes / mib)) MiB) and $dist ($((dist_bytes / mib)) MiB)" \
         "pass the 64 MiB a device call copies: carry fewer builds" >&2
    return 2
  fi
  echo "gpu: a device call copies $((total / mib)) MiB of 64 (working tree $((tree_bytes / mib))," \
       "$dist $((dist_bytes / mib)))"
}
