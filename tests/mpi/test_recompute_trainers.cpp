// --recompute blocks in the trainers at 2, 3 and 4 ranks: dp_train and every pipeline schedule
// (gpipe, 1f1b, interleaved, each with and without zero bubble, and the hybrid) train exactly as
// without it, dropout included: the recompute redraws the same masks (tests/unit/test_recompute.cpp
// checks the mechanism on one model).
#include <gtest/gtest.h>

#include "gpt2p/parallel/trainers/dp_trainer.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"
#include "support/h5_read.h"
#include "support/trainer_fixture.h"

namespace gpt2p::parallel {
namespace {

using gpt2p::testing::read_column;

class RecomputeTrainer : public gpt2p::testing::TrainerTest {
 protected:
  TrainConfig with(TrainConfig c, model::Recompute r) const {
    c.output.out += std::string("-") + std::string(name_of(r));
    c.compute.recompute = r;
    c.model.dropout = 0.1;
    c.output.save_every = -1;
    return c;
  }
  // The two runs' losses, step by step on this rank: the same bits.
  void expect_identical(const std::string& out, size_t steps) const {
    const auto none = read_column(rank_file(out + "-none"), "/steps/loss");
    const auto blocks = read_column(rank_file(out + "-blocks"), "/steps/loss");
    ASSERT_EQ(none.size(), steps);
    ASSERT_EQ(blocks.size(), steps);
    for (size_t i = 0; i < steps; ++i) EXPECT_EQ(blocks[i], none[i]) << "step " << i;
  }
};

TEST_F(RecomputeTrainer, DataParallelTrainsExactlyAsWithout) {
  auto c = config("dp", 3);
  c.data_parallel.bucket_mb = 0.05;
  for (auto r : {model::Recompute::kNone, model::Recompute::kBlocks}) {
    ASSERT_EQ(train_data_parallel(with(c, r), Program::kDataParallel, topo), 0);
  }
  expect_identical("dp", 3);
}

TEST_F(RecomputeTrainer, EveryScheduleTrainsExactlyAsWithout) {
  const int n = comm->size();
  struct Case {
    const char* name;
    pipeline::ScheduleKind schedule;
    int microbatches;
    bool zero_bubble;
    int dp;
  };
  using pipeline::ScheduleKind;
  const Case cases[] = {{"gpipe", ScheduleKind::kGPipe, 4, false, 1},
                        {"1f1b", ScheduleKind::kOneFOneB, 4, false, 1},
                        {"1f1b-zb", ScheduleKind::kOneFOneB, 4, true, 1},
                        {"gpipe-zb", ScheduleKind::kGPipe, 4, true, 1},
                        {"interleaved", ScheduleKind::kInterleaved, 2 * n, false, 1},
                        {"interleaved-zb", ScheduleKind::kInterleaved, 2 * n, true, 1},
                        {"hybrid", ScheduleKind::kOneFOneB, 2, false, 2}};
  for (const auto& k : cases) {
    if (12 % (k.microbatches * k.dp) != 0 || n % k.dp != 0) continue;
    SCOPED_TRACE(k.name);
    auto c = config(std::string("pp-") + k.name, 3, /*blocks=*/8);
    c.pipeline.schedule = k.schedule;
    c.pipeline.microbatches = k.microbatches;
    c.pipeline.zero_bubble = k.zero_bubble;
    c.pipeline.dp = k.dp;
    c.pipeline.stages_per_rank = k.schedule == ScheduleKind::kInterleaved ? 2 : 1;
    for (auto r : {model::Recompute::kNone, model::Recompute::kBlocks}) {
      ASSERT_EQ(train_pipeline(with(c, r), topo), 0);
    }
    expect_identical(std::string("pp-") + k.name, 3);
  }
}

}  // namespace
}  // namespace gpt2p::parallel
