// What a tensor-parallel group pins of NCCL and a TP trace's header records (kernels/nccl_comm.h
// sets it). No CUDA header: cli/ includes it.
#pragma once

#include <cstdint>
#include <string>

namespace ls {

// What a TP trace's header records about the collectives (NCCL_ALGO, NCCL_PROTO, the version).
struct NcclPinning {
  std::string algo;   // NCCL_ALGO
  std::string proto;  // NCCL_PROTO
  int32_t version = 0;  // ncclGetVersion
};

// The pinned values: one ring, the simple protocol, NVLink SHARP (multicast) off.
inline constexpr const char* kNcclAlgo = "Ring";
inline constexpr const char* kNcclProto = "Simple";

}  // namespace ls
