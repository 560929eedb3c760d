// NCCL, loaded when a tensor-parallel group first calls it rather than when a program starts: the
// library is ~218 MB, and linking it would cost every lockstep process its relocations at exec
// time, as cuBLAS would (kernels/cublas_loader.cpp, whose pattern this follows). Each entry point
// the TP group calls is defined here with the header's own signature, forwarding to the function
// of libnccl.so.<major>, dlopen'ed (RTLD_LOCAL) at the first call. A machine without the library
// gets ls::Error naming it and dlerror()'s reason.
#include "kernels/dynamic_library.h"

#include <fmt/format.h>
#include <nccl.h>

#include <string>

namespace ls::kernels {
namespace {

// Opened once (thread-safe static initialisation).
void* resolve_nccl(const char* name) {
  static void* const handle = [] {
    const std::string soname = fmt::format("libnccl.so.{}", NCCL_MAJOR);
    return open_library(soname, fmt::format("tensor parallelism on CUDA needs {} (NCCL {})",
                                            soname, NCCL_MAJOR));
  }();
  return resolve_function(handle, name, fmt::format("NCCL {}", NCCL_MAJOR));
}

}  // namespace
}  // namespace ls::kernels

#define LS_NCCL_FORWARD(result, name, params, args)                                               \
  extern "C" result name params {                                                                 \
    using Function = result(*) params;                                                            \
    static const auto real = reinterpret_cast<Function>(::ls::kernels::resolve_nccl(#name));      \
    return real args;                                                                             \
  }

LS_NCCL_FORWARD(ncclResult_t, ncclGetVersion, (int* version), (version))
LS_NCCL_FORWARD(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * unique_id), (unique_id))
LS_NCCL_FORWARD(ncclResult_t, ncclCommInitRank,
                (ncclComm_t * comm, int nranks, ncclUniqueId comm_id, int rank),
                (comm, nranks, comm_id, rank))
LS_NCCL_FORWARD(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist),
                (comm, ndev, devlist))
LS_NCCL_FORWARD(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))
LS_NCCL_FORWARD(const char*, ncclGetErrorString, (ncclResult_t result), (result))
LS_NCCL_FORWARD(ncclResult_t, ncclGroupStart, (), ())
LS_NCCL_FORWARD(ncclResult_t, ncclGroupEnd, (), ())
LS_NCCL_FORWARD(ncclResult_t, ncclAllReduce,
                (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                 ncclComm_t comm, cudaStream_t stream),
                (send, recv, count, type, op, comm, stream))
LS_NCCL_FORWARD(ncclResult_t, ncclAllGather,
                (const void* send, void* recv, size_t send_count, ncclDataType_t type,
                 ncclComm_t comm, cudaStream_t stream),
                (send, recv, send_count, type, comm, stream))
