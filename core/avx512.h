// What the CPU reference's AVX-512 paths share (the record's digest and top-k, which run over
// every logit of every recorded step): the target attribute, the CPU check that picks a path
// once (at its first call), and the diagnostics GCC 12 gets wrong inside the intrinsics. Each such
// path has a portable twin that tests hold to the same definition.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#define LS_HAS_AVX512_PATHS 1
// popcnt: the mask counts (x86-64's baseline has no popcnt instruction).
#define LS_AVX512 [[gnu::target("avx512f,popcnt")]]
// GCC 12's AVX-512 intrinsics read an "undefined" source register inside the unmasked forms,
// which -W(maybe-)uninitialized reports once they are inlined (GCC bug 105593).
#define LS_AVX512_BEGIN                                            \
  _Pragma("GCC diagnostic push")                                   \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")      \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define LS_AVX512_END _Pragma("GCC diagnostic pop")

namespace ls {
inline bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f"); }
}  // namespace ls
#else
#define LS_HAS_AVX512_PATHS 0
#endif
