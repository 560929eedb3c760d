# Sourced by scripts/gpu-run.sh and scripts/gpu-ab.sh: the shared libraries a package carries
# because the H200 host lacks them (GPU.md): fmt, xxHash, Cap'n Proto and KJ (the trace replayed
# by the determinism test), and this toolchain's libstdc++/libgcc_s for libfmt. cuBLAS comes from
# the host (13.1).
# shellcheck disable=SC2034
GPU_HOST_LACKS_LIBS="libfmt.so.9 libxxhash.so.0 libstdc++.so.6 libgcc_s.so.1 libcapnp-0.9.2.so libkj-0.9.2.so"
