// FusedAdamW on a GPU: one fused kernel, and the same parameters as torch::optim::AdamW's
// per-parameter step to float rounding (the kernel evaluates the same formula in another order).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "../unit/optim_check.h"

namespace gpt2p {
namespace {

TEST(FusedAdamWGpu, MatchesTorchsAdamW) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  bool fused = false;
  const double diff = testing::fused_adamw_difference(torch::Device(torch::kCUDA, 0), 5, &fused);
  EXPECT_TRUE(fused) << "CUDA fp32 parameters must take the fused kernel";
  EXPECT_LT(diff, 1e-5);
}

}  // namespace
}  // namespace gpt2p
