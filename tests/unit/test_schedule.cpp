// Pipeline schedules as data: exact small tables (laid out like the drawings) and round trips.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/schedule.h"
#include "support/errors.h"

namespace gpt2p::pipeline {
namespace {

using gpt2p::testing::error_of;

// One line per rank, written like the per-rank action lists in the header.
Schedule ranks(const std::vector<std::string>& lines) {
  Schedule s;
  for (const auto& line : lines) s.push_back(parse_actions(line));
  return s;
}

// clang-format off
TEST(ClockCycles, SixMicroBatchesTwoStages) {
  const std::vector<std::vector<Cell>> expected = {
      {{0, 0}},
      {{1, 0}, {0, 1}},
      {{2, 0}, {1, 1}},
      {{3, 0}, {2, 1}},
      {{4, 0}, {3, 1}},
      {{5, 0}, {4, 1}},
      {        {5, 1}},
  };
  EXPECT_EQ(clock_cycles(6, 2), expected);
}

TEST(ClockCycles, ThreeMicroBatchesThreeStages) {
  const std::vector<std::vector<Cell>> expected = {
      {{0, 0}},
      {{1, 0}, {0, 1}},
      {{2, 0}, {1, 1}, {0, 2}},
      {        {2, 1}, {1, 2}},
      {                {2, 2}},
  };
  EXPECT_EQ(clock_cycles(3, 3), expected);
}

TEST(ClockCycles, FewerMicroBatchesThanStages) {
  const std::vector<std::vector<Cell>> expected = {
      {{0, 0}},
      {{0, 1}},
      {{0, 2}},
  };
  EXPECT_EQ(clock_cycles(1, 3), expected);
  const std::vector<std::vector<Cell>> one_stage = {{{0, 0}}, {{1, 0}}};
  EXPECT_EQ(clock_cycles(2, 1), one_stage);
}
// clang-format on

TEST(ClockCycles, EveryCellOnceAndDiagonal) {
  for (int m = 1; m <= 9; ++m) {
    for (int n = 1; n <= 9; ++n) {
      const auto ticks = clock_cycles(m, n);
      ASSERT_EQ(static_cast<int>(ticks.size()), m + n - 1);
      std::vector<int> seen(m * n, 0);
      for (size_t k = 0; k < ticks.size(); ++k) {
        for (size_t c = 0; c < ticks[k].size(); ++c) {
          const Cell cell = ticks[k][c];
          EXPECT_EQ(cell.microbatch + cell.stage, static_cast<int>(k));
          if (c > 0) {
            EXPECT_LT(ticks[k][c - 1].stage, cell.stage);
          }
          ++seen[cell.microbatch * n + cell.stage];
        }
      }
      for (int v : seen) EXPECT_EQ(v, 1) << "m=" << m << " n=" << n;
    }
  }
}

TEST(ClockCycles, RejectsEmptySizes) {
  EXPECT_NE(error_of([] { clock_cycles(0, 2); }).find("n_microbatches = 0"), std::string::npos);
  EXPECT_NE(error_of([] { clock_cycles(2, 0); }).find("n_stages = 0"), std::string::npos);
}

TEST(Action, PrintsLikeTorch) {
  using Op = Action::Op;
  EXPECT_EQ(to_string(Action{Op::kForward, 2, 0, -1}), "2F0");
  EXPECT_EQ(to_string(Action{Op::kBackward, 1, 3, -1}), "1B3");
  EXPECT_EQ(to_string(Action{Op::kSendActivation, 0, 1, 1}), "0SEND_F1->1");
  EXPECT_EQ(to_string(Action{Op::kRecvActivation, 1, 1, 0}), "1RECV_F1<-0");
  EXPECT_EQ(to_string(Action{Op::kSendGrad, 1, 12, 0}), "1SEND_B12->0");
  EXPECT_EQ(to_string(Action{Op::kRecvGrad, 10, 1, 11}), "10RECV_B1<-11");
}

TEST(Action, ParseRoundTrips) {
  for (const char* text :
       {"2F0", "1B3", "0SEND_F1->1", "1RECV_F1<-0", "1SEND_B12->0", "10RECV_B1<-11", "63F63"}) {
    EXPECT_EQ(to_string(parse_action(text)), text);
  }
  const Action a = parse_action("3RECV_B7<-4");
  EXPECT_EQ(a.op, Action::Op::kRecvGrad);
  EXPECT_EQ(a.stage, 3);
  EXPECT_EQ(a.microbatch, 7);
  EXPECT_EQ(a.peer, 4);
  const RankActions list = parse_actions("  0F0\t0SEND_F0->1\n 0B0 ");
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(to_string(list), "0F0 0SEND_F0->1 0B0");
}

TEST(Action, ParseErrorsSayWhatAndHow) {
  EXPECT_NE(error_of([] { parse_action("F0"); }).find("'F0' does not start with a stage"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_action("0X1"); }).find("no known op"), std::string::npos);
  EXPECT_NE(error_of([] { parse_action("0F"); }).find("no micro-batch number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_action("0SEND_F1"); }).find("needs '->peer'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_action("1RECV_F1->0"); }).find("needs '<-peer'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_action("0F1x"); }).find("trailing text 'x'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_action("0F1x"); }).find("e.g. 2F0"), std::string::npos);
}

TEST(GPipe, ForwardsThenBackwardsInTorchOrder) {
  const Schedule expected = ranks({
      "0F0 0F1 0F2 0B0 0B1 0B2",
      "1F0 1F1 1F2 1B0 1B1 1B2",
  });
  EXPECT_EQ(gpipe_schedule(3, 2), expected);
}

TEST(GPipe, WithCommunication) {
  const Schedule expected = ranks({
      "0F0 0SEND_F0->1 0F1 0SEND_F1->1 0RECV_B0<-1 0B0 0RECV_B1<-1 0B1",
      "1RECV_F0<-0 1F0 1SEND_F0->2 1RECV_F1<-0 1F1 1SEND_F1->2 "
      "1RECV_B0<-2 1B0 1SEND_B0->0 1RECV_B1<-2 1B1 1SEND_B1->0",
      "2RECV_F0<-1 2F0 2RECV_F1<-1 2F1 2B0 2SEND_B0->1 2B1 2SEND_B1->1",
  });
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::kGPipe, 2, 3)), to_string(expected));
}

TEST(OneFOneB, WarmupSteadyCooldown) {
  const Schedule expected = ranks({
      "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
      "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
      "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
  });
  EXPECT_EQ(to_string(one_f_one_b_schedule(4, 3)), to_string(expected));
}

TEST(OneFOneB, FewerMicroBatchesThanStagesCapsWarmup) {
  const Schedule expected = ranks({
      "0F0 0F1 0B0 0B1",
      "1F0 1F1 1B0 1B1",
      "2F0 2F1 2B0 2B1",
      "3F0 3B0 3F1 3B1",
  });
  EXPECT_EQ(to_string(one_f_one_b_schedule(2, 4)), to_string(expected));
  EXPECT_EQ(to_string(one_f_one_b_schedule(1, 3)),
            to_string(ranks({"0F0 0B0", "1F0 1B0", "2F0 2B0"})));
}

TEST(OneFOneB, SingleStageNeedsNoCommunication) {
  const Schedule expected = ranks({"0F0 0B0 0F1 0B1 0F2 0B2"});
  EXPECT_EQ(make_schedule(ScheduleKind::kOneFOneB, 3, 1), expected);
  EXPECT_EQ(make_schedule(ScheduleKind::kGPipe, 1, 1), ranks({"0F0 0B0"}));
}

TEST(OneFOneB, WithCommunicationTwoStages) {
  const Schedule expected = ranks({
      "0F0 0SEND_F0->1 0F1 0SEND_F1->1 0RECV_B0<-1 0B0 0RECV_B1<-1 0B1",
      "1RECV_F0<-0 1F0 1B0 1SEND_B0->0 1RECV_F1<-0 1F1 1B1 1SEND_B1->0",
  });
  EXPECT_EQ(to_string(make_schedule(ScheduleKind::kOneFOneB, 2, 2)), to_string(expected));
}

TEST(AddCommunication, RejectsScheduleThatAlreadyCommunicates) {
  const Schedule with_comm = make_schedule(ScheduleKind::kGPipe, 2, 2);
  const std::string msg = error_of([&] { add_communication(with_comm, 2); });
  EXPECT_NE(msg.find("rank 0 already holds '0SEND_F0->1'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("compute-only"), std::string::npos) << msg;
  EXPECT_NE(error_of([] {
              add_communication(gpipe_schedule(2, 2), 3);
            }).find("has 2 ranks but n_stages = 3"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { add_communication(ranks({"1F0"}), 1); }).find("rank 0 holds '1F0' of stage 1"),
      std::string::npos);
}

TEST(ScheduleKind, ParsesNames) {
  EXPECT_EQ(parse_schedule_kind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(to_string(ScheduleKind::kOneFOneB), "1f1b");
  EXPECT_EQ(to_string(ScheduleKind::kGPipe), "gpipe");
  const std::string msg = error_of([] { parse_schedule_kind("pipedream"); });
  EXPECT_NE(msg.find("unknown pipeline schedule 'pipedream'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use one of: gpipe, 1f1b, interleaved"), std::string::npos) << msg;
  EXPECT_EQ(parse_schedule_kind("interleaved"), ScheduleKind::kInterleaved);
  EXPECT_EQ(to_string(ScheduleKind::kInterleaved), "interleaved");
}

// Megatron-LM's order for 2 ranks x 2 stages, 4 micro-batches: rank 0 runs stages 0 and 2,
// warms up with 2 (R - r - 1) + (V - 1) R = 4 forwards, rank 1 (stages 1, 3) with 2.
TEST(Interleaved, TwoRanksTwoStagesEachFourMicroBatches) {
  const Schedule expected = ranks({
      "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
      "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
  });
  EXPECT_EQ(to_string(interleaved_schedule(4, 2, 2)), to_string(expected));
}

TEST(Interleaved, AsManyMicroBatchesAsRanksRunsAllForwardsFirst) {
  const Schedule expected =
      ranks({"0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1", "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1"});
  EXPECT_EQ(to_string(interleaved_schedule(2, 2, 2)), to_string(expected));
}

TEST(Interleaved, CommunicationNamesPeerStagesOnOtherRanks) {
  const Schedule s = make_schedule(ScheduleKind::kInterleaved, 2, 2, 2);
  ASSERT_EQ(s.size(), 2u);
  // Stage 1 (rank 1) hands its activation to stage 2, which is back on rank 0.
  EXPECT_EQ(to_string(s[1]).find("1RECV_F0<-0 1F0 1SEND_F0->2 1RECV_F1<-0 1F1 1SEND_F1->2"), 0u)
      << to_string(s[1]);
  EXPECT_NE(to_string(s[0]).find("2RECV_F0<-1 2F0 2SEND_F0->3"), std::string::npos)
      << to_string(s[0]);
  EXPECT_NE(to_string(s[0]).find("2RECV_B0<-3 2B0 2SEND_B0->1"), std::string::npos)
      << to_string(s[0]);
}

TEST(Interleaved, RejectsSizesItCannotRun) {
  EXPECT_NE(error_of([] {
              interleaved_schedule(3, 2, 2);
            }).find("3 micro-batches are not a multiple of the 2 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([] { interleaved_schedule(4, 2, 1); }).find("1 stage(s) per rank"),
            std::string::npos);
  const std::string msg = error_of([] { make_schedule(ScheduleKind::kOneFOneB, 4, 2, 2); });
  EXPECT_NE(msg.find("1f1b runs one stage per rank, not 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--schedule interleaved"), std::string::npos) << msg;
}

TEST(Channel, WrapsOnlyWhereATransferGoesAgainstTheRankOrder) {
  EXPECT_EQ(channel_of(parse_action("0SEND_F0->1"), 2), Channel::kActivations);
  EXPECT_EQ(channel_of(parse_action("1RECV_F0<-0"), 2), Channel::kActivations);
  EXPECT_EQ(channel_of(parse_action("1SEND_F0->2"), 2), Channel::kActivationsWrap);
  EXPECT_EQ(channel_of(parse_action("2RECV_F0<-1"), 2), Channel::kActivationsWrap);
  EXPECT_EQ(channel_of(parse_action("1SEND_B0->0"), 2), Channel::kGradients);
  EXPECT_EQ(channel_of(parse_action("2SEND_B0->1"), 2), Channel::kGradientsWrap);
  EXPECT_EQ(channel_of(parse_action("1RECV_B0<-2"), 2), Channel::kGradientsWrap);
  EXPECT_EQ(channel_of(parse_action("2SEND_F0->3"), 4), Channel::kActivations);
  EXPECT_EQ(channel_of(parse_action("3SEND_F0->4"), 4), Channel::kActivationsWrap);
  EXPECT_NE(error_of([] { channel_of(parse_action("0F0"), 2); }).find("is no transfer"),
            std::string::npos);
}

}  // namespace
}  // namespace gpt2p::pipeline
