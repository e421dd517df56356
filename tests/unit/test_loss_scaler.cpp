// Dynamic loss scaling's rule (parallel/loss_scaler.h), one rank.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/parallel/train/loss_scaler.h"
#include "gpt2p/parallel/train/options.h"

namespace gpt2p::parallel {
namespace {

// The options as resolve_train_config leaves them (kAuto: dynamic with fp16 only).
LossScaleOptions config(model::Precision precision, LossScaleMode mode = LossScaleMode::kAuto) {
  TrainConfig c;
  c.compute.precision = precision;
  c.loss_scale.mode = mode;
  c.loss_scale.init = 1024;
  c.loss_scale.window = 3;
  resolve_train_config(c, Program::kSingle, /*cuda_available=*/true);
  return c.loss_scale;
}

TEST(LossScaler, OnByDefaultForFp16Only) {
  EXPECT_TRUE(LossScaler(config(model::Precision::kFp16), {}).enabled());
  EXPECT_FALSE(LossScaler(config(model::Precision::kBf16), {}).enabled());
  EXPECT_FALSE(LossScaler(config(model::Precision::kFp32), {}).enabled());
  EXPECT_TRUE(LossScaler(config(model::Precision::kFp32, LossScaleMode::kDynamic), {}).enabled());
  LossScaler off(config(model::Precision::kFp16, LossScaleMode::kOff), {});
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_TRUE(off.update(false, nullptr, 0));  // off: never skips
  EXPECT_EQ(off.state().scale, 0.0);
  // auto is decided once, by resolve_train_config: the scaler refuses an unresolved one.
  EXPECT_THROW(LossScaler(LossScaleOptions{}, {}), Error);
}

TEST(LossScaler, HalvesAndSkipsOnOverflowAndDoublesAfterTheWindow) {
  LossScaler s(config(model::Precision::kFp16), {});
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true, nullptr, 0));
  EXPECT_TRUE(s.update(true, nullptr, 1));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true, nullptr, 2));  // the third good step in a row
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_TRUE(s.update(true, nullptr, 3));
  EXPECT_FALSE(s.update(false, nullptr, 4));  // an overflow: skipped, halved, count restarts
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.state().good_steps, 0);
  EXPECT_EQ(s.state().skipped_steps, 1);
  EXPECT_TRUE(s.update(true, nullptr, 5));
  EXPECT_TRUE(s.update(true, nullptr, 6));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true, nullptr, 7));
  EXPECT_EQ(s.scale(), 2048);
}

TEST(LossScaler, StopsGrowingAt2To24) {
  auto c = config(model::Precision::kFp16);
  c.window = 1;
  c.init = kMaxLossScale / 2;
  LossScaler s(c, {});
  s.update(true, nullptr, 0);
  s.update(true, nullptr, 1);
  EXPECT_EQ(s.scale(), kMaxLossScale);
}

TEST(LossScaler, ContinuesFromACheckpointsState) {
  LossScaler s(config(model::Precision::kFp16), {256, 2, 5});
  EXPECT_EQ(s.scale(), 256);
  EXPECT_TRUE(s.update(true, nullptr, 10));  // the window's third good step
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.state().skipped_steps, 5);
  // A checkpoint without scaling: start at --loss-scale-init.
  EXPECT_EQ(LossScaler(config(model::Precision::kFp16), {}).scale(), 1024);
}

TEST(LossScaler, GivesUpWhenEvenTheSmallestScaleOverflows) {
  auto c = config(model::Precision::kFp16);
  c.init = 1.0 / 512;
  LossScaler s(c, {});
  EXPECT_FALSE(s.update(false, nullptr, 0));  // 2^-10: still allowed
  try {
    s.update(false, nullptr, 1);
    ADD_FAILURE() << "a scale below 2^-10 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the gradients are not finite even at loss scale "
                                         "0.000976562 (step 1, 2 steps skipped in this run): "
                                         "the training has diverged"),
              std::string::npos)
        << e.what();
  }
}

TEST(LossScaler, InjectsFaultsWhereTheEnvironmentSays) {
  ::setenv("GPT2P_INJECT_NONFINITE_GRADS", "1:3,0:5", 1);
  LossScaler s(config(model::Precision::kFp16), {});
  EXPECT_TRUE(s.injects_fault(1, 3));
  EXPECT_TRUE(s.injects_fault(0, 5));
  EXPECT_FALSE(s.injects_fault(0, 3));
  ::setenv("GPT2P_INJECT_NONFINITE_GRADS", "1-3", 1);
  try {
    LossScaler bad(config(model::Precision::kFp16), {});
    ADD_FAILURE() << "a malformed fault list was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"1-3\" is not RANK:STEP"), std::string::npos)
        << e.what();
  }
  ::unsetenv("GPT2P_INJECT_NONFINITE_GRADS");
  EXPECT_FALSE(LossScaler(config(model::Precision::kFp16), {}).injects_fault(1, 3));
}

}  // namespace
}  // namespace gpt2p::parallel
