// FusedAdamW on the CPU takes torch::optim::AdamW's path: the same result, bit for bit.
#include <gtest/gtest.h>

#include "optim_check.h"

namespace gpt2p {
namespace {

TEST(FusedAdamW, OnTheCpuIsTorchsAdamWExactly) {
  bool fused = true;
  EXPECT_EQ(testing::fused_adamw_difference(torch::kCPU, 4, &fused), 0.0);
  EXPECT_FALSE(fused) << "CPU tensors never take the fused CUDA kernel";
}

}  // namespace
}  // namespace gpt2p
