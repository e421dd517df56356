// The data-parallel gradient sync's choices (torch-free): dp_train's --grad-sync, --reduce-dtype
// and --embedding-sync (grad_sync.h says what each does).
#pragma once

#include <array>

#include "gpt2p/core/names.h"

namespace gpt2p::parallel {

// --grad-sync (data parallel): one all_reduce per parameter after backward (HW5), or buckets
// reduced while backward runs (grad_sync.h).
enum class GradSyncMode { kPerParam, kBucketed };
constexpr std::array<Named<GradSyncMode>, 2> names(GradSyncMode) {
  return {{{GradSyncMode::kPerParam, "per-param"}, {GradSyncMode::kBucketed, "bucketed"}}};
}

// --reduce-dtype: the dtype gradients travel in.
enum class ReduceDtype { kFp32, kBf16 };
constexpr std::array<Named<ReduceDtype>, 2> names(ReduceDtype) {
  return {{{ReduceDtype::kFp32, "fp32"}, {ReduceDtype::kBf16, "bf16"}}};
}

// --embedding-sync: how the tied wte is reduced under --grad-sync bucketed (grad_sync.h).
enum class EmbeddingSync { kSparse, kDense };
constexpr std::array<Named<EmbeddingSync>, 2> names(EmbeddingSync) {
  return {{{EmbeddingSync::kSparse, "sparse"}, {EmbeddingSync::kDense, "dense"}}};
}

}  // namespace gpt2p::parallel
