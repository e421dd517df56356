// Pipeline schedules as data: exact small tables (laid out like the drawings) and round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/plan/schedule.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
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

TEST(Action, WeightActionRoundTrips) {
  EXPECT_EQ(to_string(Action{Action::Op::kWeight, 1, 3, -1}), "1W3");
  const Action w = parse_action("1W3");
  EXPECT_EQ(w.op, Action::Op::kWeight);
  EXPECT_EQ(w.stage, 1);
  EXPECT_EQ(w.microbatch, 3);
  EXPECT_EQ(w.peer, -1);
  EXPECT_TRUE(w.is_compute());
  EXPECT_EQ(to_string(parse_actions("0F0 0B0 0W0 12W34")), "0F0 0B0 0W0 12W34");
  EXPECT_NE(error_of([] { parse_action("0W"); }).find("no micro-batch number after W"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_action("0W1->1"); }).find("trailing text '->1'"),
            std::string::npos);
  // The form in every parse error lists all ops, W included.
  const std::string msg = error_of([] { parse_action("0X1"); });
  EXPECT_NE(msg.find("op one of F, B, W, SEND_F, RECV_F, SEND_B, RECV_B"), std::string::npos)
      << msg;
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

TEST(AddCommunication, LeavesWeightActionsInPlace) {
  // W needs no transfer: it keeps its place, after the SEND_B that follows its B.
  const Schedule expected = ranks({
      "0F0 0SEND_F0->1 0RECV_B0<-1 0B0 0W0",
      "1RECV_F0<-0 1F0 1B0 1SEND_B0->0 1W0",
  });
  const Schedule compute = ranks({"0F0 0B0 0W0", "1F0 1B0 1W0"});
  EXPECT_EQ(to_string(add_communication(compute, 2)), to_string(expected));
}

ZeroBubbleCosts zb_costs(int n, double f, double b, double w, double comm = 0.0) {
  return ZeroBubbleCosts{std::vector<double>(n, f), std::vector<double>(n, b),
                         std::vector<double>(n, w), comm};
}

// The smallest case, by hand, without a memory limit. 1F1B base, F = B = W = 1, comm = 0:
//   rank 0: 0F0 0F1 0B0 0B1          rank 1: 1F0 1B0 1F1 1B1
// Both ranks start at 0; on equal times the lower rank goes first.
//   t=0  rank 0: 0F0 [0,1].          rank 1: 1F0 needs 0F0 (ends 1), no W: idles, 1F0 [1,2].
//   t=1  rank 0: 0F1 [1,2].
//   t=2  rank 0: 0B0 needs 1B0, not placed, and no W to fill the wait: blocked.
//        rank 1: 1B0 [2,3] (its F ended at 2); 1W0 deferred.
//        rank 0: 0B0 can start at 3, a wait of 1 but no W yet: 0B0 [3,4]; 0W0 deferred.
//   t=3  rank 1: 1F1 needs 0F1 (ended 2): 1F1 [3,4] at once (no wait, so no W).
//   t=4  rank 0: 0B1 needs 1B1, not placed: an unknown wait runs the oldest W, 0W0 [4,5].
//        rank 1: 1B1 [4,5]; its base list is done: 1W0 [5,6], 1W1 [6,7].
//   t=5  rank 0: 0B1 [5,6] (1B1 ended 5), then 0W1 [6,7].
// 7 time units, against (m + n - 1) (F + B + W) = 9 for the unsplit 1F1B.
TEST(ZeroBubble, TwoStagesTwoMicroBatchesByHand) {
  const Schedule expected = ranks({
      "0F0 0F1 0B0 0W0 0B1 0W1",
      "1F0 1B0 1F1 1B1 1W0 1W1",
  });
  EXPECT_EQ(to_string(zero_bubble_schedule(one_f_one_b_schedule(2, 2), zb_costs(2, 1, 1, 1),
                                           kNoLiveLimit)),
            to_string(expected));
}

// At the base's memory (the default) the limit is the base's busiest rank: 1F1B holds 2
// micro-batches on rank 0 and 1 on rank 1, so rank 1 may hold 2 as well. Here nothing holds more,
// and the schedule is the one above.
TEST(ZeroBubble, TwoStagesTwoMicroBatchesAtTheBaseMemory) {
  const Schedule zb = zero_bubble_schedule(one_f_one_b_schedule(2, 2), zb_costs(2, 1, 1, 1));
  EXPECT_EQ(peak_live(one_f_one_b_schedule(2, 2)), (std::vector<int>{2, 1}));
  EXPECT_EQ(peak_live(zb), (std::vector<int>{2, 2}));
  EXPECT_EQ(to_string(zb), to_string(zero_bubble_schedule(one_f_one_b_schedule(2, 2),
                                                          zb_costs(2, 1, 1, 1), kNoLiveLimit)));
}

TEST(ZeroBubble, OneStageDefersAsItsMemoryAllows) {
  const Schedule base = one_f_one_b_schedule(3, 1);
  const auto costs = zb_costs(1, 1, 1, 1);
  // Nothing to wait for on one stage. At the base's memory (1 live micro-batch) every W runs
  // before the next F; each extra one lets one more W wait; without a limit all go to the end,
  // in the order of their B's.
  EXPECT_EQ(to_string(zero_bubble_schedule(base, costs)),
            to_string(ranks({"0F0 0B0 0W0 0F1 0B1 0W1 0F2 0B2 0W2"})));
  EXPECT_EQ(to_string(zero_bubble_schedule(base, costs, 1)),
            to_string(ranks({"0F0 0B0 0F1 0B1 0W0 0F2 0B2 0W1 0W2"})));
  EXPECT_EQ(to_string(zero_bubble_schedule(base, costs, kNoLiveLimit)),
            to_string(ranks({"0F0 0B0 0F1 0B1 0F2 0B2 0W0 0W1 0W2"})));
  EXPECT_EQ(to_string(zero_bubble_schedule(base, costs, std::numeric_limits<int>::max())),
            to_string(zero_bubble_schedule(base, costs, kNoLiveLimit)));
  EXPECT_EQ(peak_live(zero_bubble_schedule(base, costs, 1)), std::vector<int>{2});
  EXPECT_EQ(peak_live(zero_bubble_schedule(base, costs, kNoLiveLimit)), std::vector<int>{3});
}

TEST(ZeroBubble, PeakLiveCountsFromFToWOrToBWithoutWs) {
  EXPECT_EQ(peak_live(gpipe_schedule(4, 2)), (std::vector<int>{4, 4}));
  EXPECT_EQ(peak_live(one_f_one_b_schedule(4, 3)), (std::vector<int>{3, 2, 1}));
  EXPECT_EQ(peak_live(ranks({"0F0 0B0 0F1 0B1 0W0 0W1"})), std::vector<int>{2});
  EXPECT_EQ(peak_live(ranks({"0F0 0F1 0B0 0B1"})), std::vector<int>{2});
  EXPECT_EQ(peak_live(Schedule(2)), (std::vector<int>{0, 0}));
}

TEST(ZeroBubble, FillsAKnownWaitOnlyWithAWAtMostTwiceAsLong) {
  // 1F1B on 2 stages, F = (1, 0.5), B = (1, 1.5): rank 0 runs 0F0 [0,1] 0F1 [1,2], waits for
  // 1B0 [1.5,3], runs 0B0 [3,4] and defers 0W0. Rank 1 runs 1F1 [3,3.5] and 1B1 [3.5,5] before
  // rank 0 (free at 4) picks again, so 0B1's wait is known: 1. A W of cost 3 would delay 0B1 by
  // 2, more than half its cost: rank 0 idles. A W of cost 2 is exactly twice the wait: it runs.
  const Schedule base = one_f_one_b_schedule(2, 2);
  const auto with_w = [&](double w) {
    return to_string(zero_bubble_schedule(base, {{1, 0.5}, {1, 1.5}, {w, w}, 0.0}, kNoLiveLimit));
  };
  EXPECT_EQ(with_w(3), to_string(ranks({"0F0 0F1 0B0 0B1 0W0 0W1", "1F0 1B0 1F1 1B1 1W0 1W1"})));
  EXPECT_EQ(with_w(2), to_string(ranks({"0F0 0F1 0B0 0W0 0B1 0W1", "1F0 1B0 1F1 1B1 1W0 1W1"})));
}

TEST(ZeroBubble, RejectsCostsThatDoNotFitAndBasesItCannotSplit) {
  const Schedule base = one_f_one_b_schedule(2, 2);
  const auto fails = [&](const Schedule& b, const ZeroBubbleCosts& c, const std::string& text) {
    const std::string msg = error_of([&] { zero_bubble_schedule(b, c); });
    EXPECT_NE(msg.find(text), std::string::npos) << msg;
  };
  ZeroBubbleCosts c = zb_costs(2, 1, 1, 1);
  c.forward = {1, 1, 1};
  fails(base, c, "costs.forward has 3 entries (stages) for 2 ranks");
  c = zb_costs(2, 1, 1, 1);
  c.input_backward = {1};
  fails(base, c, "costs.input_backward has 1 entries for 2 stages");
  c = zb_costs(2, 1, 1, 1);
  c.weight_backward = {};
  fails(base, c, "costs.weight_backward has 0 entries for 2 stages");
  c = zb_costs(2, 1, 1, 1);
  c.weight_backward[1] = -1;
  fails(base, c, "costs.weight_backward of stage 1 is -1");
  c = zb_costs(2, 1, 1, 1);
  c.forward[0] = std::nan("");
  fails(base, c, "costs.forward of stage 0 is nan");
  fails(base, zb_costs(2, 1, 1, 1, -0.5), "costs.comm is -0.5");
  // Bases that are not plain F/B schedules of these stages.
  fails(ranks({"0F0 0B0 0W0", "1F0 1B0"}), zb_costs(2, 1, 1, 1),
        "rank 0 of the base already holds '0W0'");
  fails(add_communication(base, 2), zb_costs(2, 1, 1, 1), "rank 0 of the base holds '0SEND_F0->1'");
  fails(ranks({"1F0", "0F0"}), zb_costs(2, 1, 1, 1), "rank 0 holds '1F0' of stage 1 (of 2)");
  fails(ranks({"0F0 0F0 0B0", "1F0 1B0"}), zb_costs(2, 1, 1, 1), "the base runs '0F0' twice");
  fails(Schedule{}, zb_costs(2, 1, 1, 1), "the base schedule has no rank lists");
  EXPECT_NE(error_of([&] {
              zero_bubble_schedule(base, zb_costs(2, 1, 1, 1), -2);
            }).find("extra_live is -2"),
            std::string::npos);
  // Dependencies that can never be met: a B before its own F, a B whose next-stage B is missing.
  fails(ranks({"0F0 0B0", "1B0 1F0"}), zb_costs(2, 1, 1, 1),
        "rank 1 waits at '1B0' for '1F0', which rank 1 has not run yet");
  fails(ranks({"0F0 0B0", "1F0"}), zb_costs(2, 1, 1, 1),
        "rank 0 waits at '0B0' for '1B0', which the base schedule does not contain");
}

TEST(Channel, WeightActionIsNoTransfer) {
  EXPECT_NE(error_of([] { channel_of(parse_action("0W0"), 2); }).find("'0W0' is no transfer"),
            std::string::npos);
}

TEST(ScheduleKind, Names) {
  EXPECT_EQ(from_name<ScheduleKind>("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(to_string(ScheduleKind::kInterleaved), "interleaved");
  EXPECT_EQ(choices<ScheduleKind>(), "gpipe | 1f1b | interleaved");
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

// Forward only (evaluation): every stage's forwards in micro-batch order, with their activation
// transfers; a rank with several stages runs them one after the other.
TEST(ForwardOnly, OneStagePerRankForwardsInOrder) {
  EXPECT_EQ(to_string(forward_only_schedule(3, 2)),
            to_string(ranks({"0F0 0F1 0F2", "1F0 1F1 1F2"})));
  const Schedule expected = ranks({
      "0F0 0SEND_F0->1 0F1 0SEND_F1->1",
      "1RECV_F0<-0 1F0 1SEND_F0->2 1RECV_F1<-0 1F1 1SEND_F1->2",
      "2RECV_F0<-1 2F0 2RECV_F1<-1 2F1",
  });
  EXPECT_EQ(to_string(make_forward_only_schedule(2, 3)), to_string(expected));
  EXPECT_EQ(make_forward_only_schedule(2, 1), ranks({"0F0 0F1"}));
}

TEST(ForwardOnly, InterleavedStagesRunOneAfterTheOther) {
  EXPECT_EQ(to_string(forward_only_schedule(2, 2, 2)),
            to_string(ranks({"0F0 0F1 2F0 2F1", "1F0 1F1 3F0 3F1"})));
  // One micro-batch (what evaluation runs per batch) on 2 ranks x 2 stages: stage 1 hands on to
  // stage 2, back on rank 0.
  const Schedule expected = ranks({
      "0F0 0SEND_F0->1 2RECV_F0<-1 2F0 2SEND_F0->3",
      "1RECV_F0<-0 1F0 1SEND_F0->2 3RECV_F0<-2 3F0",
  });
  EXPECT_EQ(to_string(make_forward_only_schedule(1, 2, 2)), to_string(expected));
  // Any number of micro-batches, unlike the interleaved training schedule.
  EXPECT_EQ(make_forward_only_schedule(3, 2, 3)[1].size(), 3u * 3u * 3u - 3u);
}

TEST(ForwardOnly, IsNoTrainingScheduleAndRejectsEmptySizes) {
  EXPECT_EQ(choices<ScheduleKind>(), "gpipe | 1f1b | interleaved");
  EXPECT_NE(error_of([] { forward_only_schedule(0, 2); }).find("n_microbatches = 0 < 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { forward_only_schedule(1, 0); }).find("n_stages = 0 < 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_forward_only_schedule(1, 2, 0); }).find("0 stage(s) per rank"),
            std::string::npos);
  EXPECT_NE(error_of([] { forward_only_schedule(1, 1, 2); }).find("2 stages on 1 rank"),
            std::string::npos);
}

}  // namespace
}  // namespace gpt2p::pipeline
