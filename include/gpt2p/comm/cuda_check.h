// CUDA and NCCL members of the check family in core/error.h (CUDA builds only).
//
//   GPT2P_CUDA_CHECK(cudaSetDevice(d));        // "... CUDA call failed: cudaSetDevice(d): <error>"
//   GPT2P_NCCL_CHECK(ncclCommInitRank(...));   // NCCL's error string and ncclGetLastError
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "gpt2p/core/error.h"

namespace gpt2p::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file,
                                          int line) {
  throw_error(std::string("CUDA call failed: ") + call + ": " + cudaGetErrorName(code) + ": " +
                  cudaGetErrorString(code),
              "check that every rank sees its own GPU (nvidia-smi, CUDA_VISIBLE_DEVICES) and that "
              "the driver matches the CUDA runtime",
              file, line);
}

[[noreturn]] inline void throw_nccl_error(ncclResult_t code, const char* call, const char* file,
                                          int line) {
  const char* last = ncclGetLastError(nullptr);
  throw_error(std::string("NCCL call failed: ") + call + ": " + ncclGetErrorString(code) +
                  " (last NCCL error: " + (last != nullptr && *last != '\0' ? last : "none") + ")",
              "rerun with NCCL_DEBUG=WARN (or INFO) for NCCL's own log; check that every rank "
              "makes the same calls in the same order",
              file, line);
}

}  // namespace gpt2p::detail

#define GPT2P_CUDA_CHECK(call)                                                      \
  do {                                                                              \
    const cudaError_t gpt2p_cuda_rc_ = (call);                                      \
    if (gpt2p_cuda_rc_ != cudaSuccess) {                                            \
      ::gpt2p::detail::throw_cuda_error(gpt2p_cuda_rc_, #call, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)

#define GPT2P_NCCL_CHECK(call)                                                      \
  do {                                                                              \
    const ncclResult_t gpt2p_nccl_rc_ = (call);                                     \
    if (gpt2p_nccl_rc_ != ncclSuccess) {                                            \
      ::gpt2p::detail::throw_nccl_error(gpt2p_nccl_rc_, #call, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)
