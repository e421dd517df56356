// Dry runs: the schedules obey the rules for every size up to 64 stages, never deadlock, give
// GPipe's bubble (n-1)/(m+n-1), and broken plans are reported with what went wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/pipeline/plan/simulator.h"
#include "gpt2p/pipeline/plan/zero_bubble.h"
#include "support/errors.h"

namespace gpt2p::pipeline {
namespace {

using gpt2p::testing::error_of;

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

bool mentions(const std::vector<std::string>& violations, const std::string& text) {
  return std::any_of(violations.begin(), violations.end(),
                     [&](const std::string& v) { return v.find(text) != std::string::npos; });
}

Schedule ranks(const std::vector<std::string>& lines) {
  Schedule s;
  for (const auto& line : lines) s.push_back(parse_actions(line));
  return s;
}

SimCosts uniform_costs(int n, double f, double b) {
  return SimCosts{std::vector<double>(n, f), std::vector<double>(n, b), {}, 0.0};
}

// n in 1..64 with m in {1, 2, 3, n-1, n, n+1, 2n, 64}.
std::vector<std::pair<int, int>> size_grid() {
  std::vector<std::pair<int, int>> grid;
  for (int n = 1; n <= 64; ++n) {
    const std::set<int> ms{1, 2, 3, n - 1, n, n + 1, 2 * n, 64};
    for (int m : ms) {
      if (m >= 1) grid.emplace_back(m, n);
    }
  }
  return grid;
}

TEST(Simulate, GPipeTimingsTwoByTwo) {
  const SimResult r = simulate(make_schedule(ScheduleKind::kGPipe, 2, 2));
  ASSERT_TRUE(r.ok) << r.deadlock_reason;
  // rank 0: F0 SEND F1 SEND RECV_B0 B0 RECV_B1 B1
  const std::vector<std::pair<double, double>> rank0 = {{0, 1}, {1, 1}, {1, 2}, {2, 2},
                                                        {2, 5}, {5, 7}, {7, 7}, {7, 9}};
  // rank 1: RECV_F0 F0 RECV_F1 F1 B0 SEND B1 SEND
  const std::vector<std::pair<double, double>> rank1 = {{0, 1}, {1, 2}, {2, 2}, {2, 3},
                                                        {3, 5}, {5, 5}, {5, 7}, {7, 7}};
  ASSERT_EQ(r.timings.size(), 2u);
  ASSERT_EQ(r.timings[0].size(), rank0.size());
  ASSERT_EQ(r.timings[1].size(), rank1.size());
  for (size_t k = 0; k < rank0.size(); ++k) {
    EXPECT_EQ(r.timings[0][k].start, rank0[k].first) << "rank 0 action " << k;
    EXPECT_EQ(r.timings[0][k].end, rank0[k].second) << "rank 0 action " << k;
    EXPECT_EQ(r.timings[1][k].start, rank1[k].first) << "rank 1 action " << k;
    EXPECT_EQ(r.timings[1][k].end, rank1[k].second) << "rank 1 action " << k;
  }
  EXPECT_EQ(r.makespan, 9.0);
  EXPECT_EQ(r.busy, (std::vector<double>{6.0, 6.0}));
  EXPECT_NEAR(r.bubble_fraction, 1.0 / 3.0, 1e-12);
  EXPECT_EQ(r.max_live_activations, (std::vector<int>{2, 2}));
}

TEST(Simulate, CommCostDelaysReceives) {
  SimCosts costs = uniform_costs(2, 1.0, 2.0);
  costs.comm = 0.5;
  const SimResult r = simulate(make_schedule(ScheduleKind::kOneFOneB, 1, 2), costs);
  ASSERT_TRUE(r.ok) << r.deadlock_reason;
  // F (1) + transfer (0.5) + F (1) + B (2) + transfer (0.5) + B (2).
  EXPECT_DOUBLE_EQ(r.makespan, 7.0);
  EXPECT_DOUBLE_EQ(r.timings[1][0].end, 1.5);  // 1RECV_F0<-0
}

TEST(Simulate, GPipeBubbleIsExactlyNMinusOneOverMPlusNMinusOne) {
  for (int n = 1; n <= 8; ++n) {
    for (int m = 1; m <= 12; ++m) {
      for (const auto& fb : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}, std::pair{0.5, 1.5}}) {
        const SimResult r = simulate(make_schedule(ScheduleKind::kGPipe, m, n),
                                     uniform_costs(n, fb.first, fb.second));
        ASSERT_TRUE(r.ok) << r.deadlock_reason;
        const double expected = static_cast<double>(n - 1) / (m + n - 1);
        EXPECT_NEAR(r.bubble_fraction, expected, 1e-12)
            << "m=" << m << " n=" << n << " F=" << fb.first << " B=" << fb.second;
        EXPECT_NEAR(r.makespan, (fb.first + fb.second) * (m + n - 1), 1e-9);
      }
    }
  }
}

TEST(Simulate, OneFOneBSameBubbleFewerActivations) {
  for (int n = 1; n <= 8; ++n) {
    for (int m = 1; m <= 12; ++m) {
      const SimResult gpipe = simulate(make_schedule(ScheduleKind::kGPipe, m, n));
      const SimResult ofob = simulate(make_schedule(ScheduleKind::kOneFOneB, m, n));
      ASSERT_TRUE(ofob.ok) << ofob.deadlock_reason;
      EXPECT_NEAR(ofob.bubble_fraction, gpipe.bubble_fraction, 1e-12) << "m=" << m << " n=" << n;
      for (int s = 0; s < n; ++s) {
        EXPECT_EQ(gpipe.max_live_activations[s], m);
        EXPECT_EQ(ofob.max_live_activations[s], std::min(m, n - s)) << "m=" << m << " s=" << s;
      }
    }
  }
}

TEST(Simulate, UnevenStagesSlowTheWholePipeline) {
  SimCosts costs = uniform_costs(3, 1.0, 2.0);
  costs.forward[1] = 2.0;
  costs.backward[1] = 4.0;
  const SimResult even = simulate(make_schedule(ScheduleKind::kOneFOneB, 8, 3));
  const SimResult uneven = simulate(make_schedule(ScheduleKind::kOneFOneB, 8, 3), costs);
  ASSERT_TRUE(uneven.ok);
  EXPECT_GT(uneven.makespan, even.makespan);
  EXPECT_GT(uneven.bubble_fraction, even.bubble_fraction);
  // The slow stage bounds the step: it is busy 8 * 6 time units.
  EXPECT_GE(uneven.makespan, 48.0);
}

TEST(Simulate, BadCostsAreErrors) {
  const Schedule s = make_schedule(ScheduleKind::kGPipe, 2, 2);
  SimCosts wrong_size{{1.0}, {}, {}, 0.0};
  EXPECT_NE(
      error_of([&] { simulate(s, wrong_size); }).find("forward costs have 1 entries for 2 stages"),
      std::string::npos);
  SimCosts negative{{}, {2.0, -1.0}, {}, 0.0};
  EXPECT_NE(error_of([&] { simulate(s, negative); }).find("backward cost of stage 1 is -1"),
            std::string::npos);
  SimCosts bad_comm{{}, {}, {}, -0.5};
  EXPECT_NE(error_of([&] { simulate(s, bad_comm); }).find("comm cost is -0.5"), std::string::npos);
}

TEST(Rules, BothSchedulesValidAndDeadlockFreeUpTo64Stages) {
  int checked = 0;
  for (const auto& [m, n] : size_grid()) {
    const Schedule gpipe = make_schedule(ScheduleKind::kGPipe, m, n);
    const Schedule ofob = make_schedule(ScheduleKind::kOneFOneB, m, n);
    const auto v_gpipe = validate(gpipe, m, n);
    ASSERT_TRUE(v_gpipe.empty()) << "gpipe m=" << m << " n=" << n << "\n" << joined(v_gpipe);
    const auto v_ofob = validate(ofob, m, n, {true, true});
    ASSERT_TRUE(v_ofob.empty()) << "1f1b m=" << m << " n=" << n << "\n" << joined(v_ofob);
    const auto v_compute = validate(one_f_one_b_schedule(m, n), m, n, {false, true});
    ASSERT_TRUE(v_compute.empty()) << "1f1b compute m=" << m << " n=" << n;
    const SimResult r_gpipe = simulate(gpipe);
    ASSERT_TRUE(r_gpipe.ok) << "gpipe m=" << m << " n=" << n << "\n" << r_gpipe.deadlock_reason;
    const SimResult r_ofob = simulate(ofob);
    ASSERT_TRUE(r_ofob.ok) << "1f1b m=" << m << " n=" << n << "\n" << r_ofob.deadlock_reason;
    ++checked;
  }
  EXPECT_GT(checked, 400);
}

TEST(Rules, OneStreamPerDirectionNeverDeadlocks) {
  // What pp_train does with NCCL (each transfer waits on its stream for its partner): free of
  // deadlock for both schedules, and never slower than MPI's buffered sends at zero comm cost.
  int checked = 0;
  for (const auto& [m, n] : size_grid()) {
    if (n > 16) continue;
    for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      const Schedule s = make_schedule(kind, m, n);
      const SimResult nccl = simulate(s, {}, Transfers::kStreamPerDirection);
      ASSERT_TRUE(nccl.ok) << to_string(kind) << " m=" << m << " n=" << n << "\n"
                           << nccl.deadlock_reason;
      EXPECT_LE(nccl.makespan, simulate(s).makespan + 1e-9) << to_string(kind) << " m=" << m;
      ++checked;
    }
  }
  EXPECT_GT(checked, 200);
}

TEST(Rules, InterleavedSchedulesAreValidAndNeverDeadlock) {
  int checked = 0;
  for (int R : {2, 3, 4, 8}) {
    for (int V : {2, 3, 4}) {
      for (int m = R; m <= 32; m += R) {
        const Schedule s = make_schedule(ScheduleKind::kInterleaved, m, R, V);
        const auto v = validate(s, m, R * V);
        ASSERT_TRUE(v.empty()) << "R=" << R << " V=" << V << " m=" << m << "\n" << joined(v);
        for (auto transfers : {Transfers::kBuffered, Transfers::kStreamPerDirection}) {
          const SimResult r = simulate(s, {}, transfers);
          ASSERT_TRUE(r.ok) << "R=" << R << " V=" << V << " m=" << m << "\n" << r.deadlock_reason;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// NCCL matches a stream's sends and receives between two ranks by order alone. On every channel
// of every schedule pp_train runs, a rank only sends to or only receives from a given peer rank,
// and the k-th send from a to b carries what the k-th receive at b from a expects.
TEST(Rules, EveryChannelCarriesOneDirectionInTheSameOrderOnBothSides) {
  for (int R : {2, 3, 4}) {
    for (int V : {1, 2, 3}) {
      for (int m : {R, 2 * R, 4 * R}) {
        std::vector<std::pair<std::string, Schedule>> schedules;
        if (V == 1) {
          for (auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
            schedules.emplace_back(to_string(kind), make_schedule(kind, m, R, V));
          }
        } else {
          schedules.emplace_back("interleaved", make_schedule(ScheduleKind::kInterleaved, m, R, V));
        }
        // Evaluation's forward-only schedule travels the same channels.
        schedules.emplace_back("forward-only", make_forward_only_schedule(m, R, V));
        schedules.emplace_back("forward-only m=1", make_forward_only_schedule(1, R, V));
        for (const auto& [name, s] : schedules) {
          // (channel, from rank, to rank) -> the transfers in posting order, per side.
          std::map<std::tuple<int, int, int>, std::vector<std::string>> sent, received;
          for (int r = 0; r < R; ++r) {
            for (const Action& a : s[r]) {
              if (a.is_compute()) continue;
              const int c = static_cast<int>(channel_of(a, R));
              const int peer = rank_of_stage(a.peer, R);
              Action partner = a;  // how the sender would print it
              if (a.is_recv()) {
                partner.stage = a.peer;
                partner.peer = a.stage;
                partner.op = a.op == Action::Op::kRecvActivation ? Action::Op::kSendActivation
                                                                 : Action::Op::kSendGrad;
                received[{c, peer, r}].push_back(to_string(partner));
              } else {
                sent[{c, r, peer}].push_back(to_string(a));
              }
            }
          }
          const std::string what = name + " R=" + std::to_string(R) + " V=" + std::to_string(V) +
                                   " m=" + std::to_string(m);
          EXPECT_EQ(sent, received) << what;
          for (const auto& [key, list] : sent) {
            const auto [c, from, to] = key;
            EXPECT_EQ(sent.count({c, to, from}), 0u)
                << what << ": channel " << c << " carries both " << from << "->" << to
                << " and back";
          }
        }
      }
    }
  }
}

// Interleaving V stages per rank cuts the fill and drain to (R - 1) / V of a rank's per
// micro-batch work: 2 ranks, 2 stages each of F = 1, B = 2, 4 micro-batches: 24 busy + 3 idle.
TEST(Simulate, InterleavingShrinksTheBubble) {
  const SimResult inter =
      simulate(make_schedule(ScheduleKind::kInterleaved, 4, 2, 2), uniform_costs(4, 1, 2));
  ASSERT_TRUE(inter.ok) << inter.deadlock_reason;
  EXPECT_DOUBLE_EQ(inter.busy[0], 24.0);
  // The same work as two plain stages of F = 2, B = 4: (m + n - 1) (F + B) = 30.
  const SimResult plain =
      simulate(make_schedule(ScheduleKind::kOneFOneB, 4, 2), uniform_costs(2, 2, 4));
  EXPECT_DOUBLE_EQ(plain.makespan, 30.0);
  EXPECT_DOUBLE_EQ(inter.makespan, 27.0);
  EXPECT_LT(inter.bubble_fraction, plain.bubble_fraction);
}

TEST(Rules, OneStreamDeadlocksOneFOneBButNotGPipe) {
  // Why pp_train uses two streams: on one, stage 0's send of F1 waits for a receive that stage 1
  // queued behind its own send of B0, which waits for a receive queued behind F1's send.
  const SimResult ofob =
      simulate(make_schedule(ScheduleKind::kOneFOneB, 4, 2), {}, Transfers::kOneStream);
  EXPECT_FALSE(ofob.ok);
  EXPECT_NE(ofob.deadlock_reason.find("rank 0 waits forever at action #3 '0SEND_F1->1': the "
                                      "matching transfer never starts; rank 1 is at action #3 "
                                      "'1SEND_B0->0'"),
            std::string::npos)
      << ofob.deadlock_reason;
  for (int n : {2, 3, 4}) {
    EXPECT_TRUE(simulate(make_schedule(ScheduleKind::kGPipe, 4, n), {}, Transfers::kOneStream).ok);
  }
}

TEST(Simulate, StreamTransfersWaitForTheLaterPost) {
  // Stage 1 posts its receive at 0, stage 0 its send after F0 (at 1): the transfer ends at
  // 1 + comm, then 1F0 runs.
  const Schedule s = ranks({"0F0 0SEND_F0->1", "1RECV_F0<-0 1F0"});
  const SimResult r =
      simulate(s, {{1.0, 1.0}, {2.0, 2.0}, {}, 0.5}, Transfers::kStreamPerDirection);
  ASSERT_TRUE(r.ok) << r.deadlock_reason;
  EXPECT_DOUBLE_EQ(r.timings[0][1].start, 1.0);
  EXPECT_DOUBLE_EQ(r.timings[0][1].end, 1.5);
  EXPECT_DOUBLE_EQ(r.timings[1][0].start, 0.0);
  EXPECT_DOUBLE_EQ(r.timings[1][0].end, 1.5);
  EXPECT_DOUBLE_EQ(r.timings[1][1].start, 1.5);
  EXPECT_DOUBLE_EQ(r.makespan, 2.5);
}

TEST(Rules, GPipeBreaksTheOneFOneBMemoryRule) {
  const auto v = validate(make_schedule(ScheduleKind::kGPipe, 4, 2), 4, 2, {true, true});
  EXPECT_TRUE(mentions(v, "rank 1 action #3 '1F1': 2 activations alive; 1F1B allows at most 1"))
      << joined(v);
  EXPECT_TRUE(mentions(v, "rank 0 action #4 '0F2': 3 activations alive; 1F1B allows at most 2"))
      << joined(v);
}

TEST(Rules, SwappedActionsDeadlock) {
  // Rank 0 waits for the gradient of micro-batch 0 before it sends the activation rank 1 needs.
  const Schedule s = ranks({
      "0F0 0RECV_B0<-1 0SEND_F0->1 0B0",
      "1RECV_F0<-0 1F0 1B0 1SEND_B0->0",
  });
  EXPECT_TRUE(validate(s, 1, 2).empty()) << "each rank alone follows the rules";
  const SimResult r = simulate(s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.deadlock_reason.find("rank 0 waits forever at action #1 '0RECV_B0<-1'"),
            std::string::npos)
      << r.deadlock_reason;
  EXPECT_NE(r.deadlock_reason.find("rank 1 waits forever at action #0 '1RECV_F0<-0': no "
                                   "matching send was issued; rank 0 is at action #1 "
                                   "'0RECV_B0<-1'"),
            std::string::npos)
      << r.deadlock_reason;
  EXPECT_EQ(r.timings[0].size(), 1u);  // only 0F0 ran
  EXPECT_EQ(r.timings[1].size(), 0u);
}

TEST(Rules, DroppedSendIsReportedByBoth) {
  Schedule s = make_schedule(ScheduleKind::kGPipe, 2, 2);
  auto& r0 = s[0];
  r0.erase(std::find(r0.begin(), r0.end(), parse_action("0SEND_F1->1")));
  const auto v = validate(s, 2, 2);
  EXPECT_TRUE(mentions(v,
                       "stage 0: micro-batch 1 sends its activation to the next stage 0 times "
                       "(expected exactly once)"))
      << joined(v);
  const SimResult r = simulate(s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.deadlock_reason.find("rank 1 waits forever at action #2 '1RECV_F1<-0'"),
            std::string::npos)
      << r.deadlock_reason;
}

TEST(Rules, ReceiveNobodySendsNamesTheFinishedPeer) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 1, 2);
  s[1].push_back(parse_action("1RECV_F0<-0"));
  const SimResult r = simulate(s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.deadlock_reason.find("rank 0 has finished its list"), std::string::npos)
      << r.deadlock_reason;
  EXPECT_TRUE(mentions(validate(s, 1, 2),
                       "stage 1: micro-batch 0 receives its activation from the previous stage 2 "
                       "times"));
}

TEST(Rules, OrderAndShapeViolations) {
  // B before F, F before its RECV_F, SEND_F before its F, a wrong peer, a foreign stage and a
  // micro-batch out of range.
  const Schedule s = ranks({
      "0SEND_F0->1 0F0 0RECV_B0<-1 0B0 0F5",
      "1B0 1F0 1RECV_F0<-0 1SEND_B0->2 0F0",
  });
  const auto v = validate(s, 1, 2);
  EXPECT_TRUE(mentions(v, "rank 0 action #0 '0SEND_F0->1': SEND_F before the F")) << joined(v);
  EXPECT_TRUE(mentions(v, "rank 0 action #4 '0F5': micro-batch out of range [0, 1)"));
  EXPECT_TRUE(mentions(v, "rank 1 action #0 '1B0': B before its F"));
  EXPECT_TRUE(mentions(v, "rank 1 action #1 '1F0': F before its RECV_F"));
  EXPECT_TRUE(mentions(v, "rank 1 action #3 '1SEND_B0->2': peer must be the previous stage 0"));
  EXPECT_TRUE(mentions(v, "rank 1 action #4 '0F0': names stage 0 on rank 1"));
  EXPECT_TRUE(
      mentions(v, "stage 1: micro-batch 0 sends its gradient to the previous stage 0 times"));
  EXPECT_TRUE(
      mentions(validate(ranks({"0F0 0F0 0B0"}), 1, 1), "stage 0: micro-batch 0 forwarded 2 times"));
  EXPECT_TRUE(mentions(validate(s, 1, 3), "the schedule has 2 rank lists for 3 stages"));
  EXPECT_TRUE(
      mentions(validate(ranks({"0F0 0SEND_F0->1 0B0"}), 1, 1), "the last stage has no next stage"));
  EXPECT_TRUE(mentions(validate(ranks({"0F0"}), 1, 1), "micro-batch 0 backwarded 0 times"));
}

// Forward-only schedules (evaluation) of one and several stages per rank: valid as such, free of
// deadlock with MPI's buffered sends and with pp_train's stream per direction (with one stage per
// rank, on one stream too; stages that wrap need their own channel, as interleaved training does),
// keeping nothing alive for a backward.
TEST(Rules, ForwardOnlySchedulesAreValidAndNeverDeadlock) {
  int checked = 0;
  for (int R : {1, 2, 3, 4, 8}) {
    for (int V : {1, 2, 3}) {
      if (R == 1 && V > 1) continue;  // rejected: a rank sends nothing to itself
      for (int m : {1, 2, 3, 8}) {
        const Schedule s = make_forward_only_schedule(m, R, V);
        const std::string what =
            "R=" + std::to_string(R) + " V=" + std::to_string(V) + " m=" + std::to_string(m);
        const auto v = validate(s, m, R * V, {true, true, true});
        ASSERT_TRUE(v.empty()) << what << "\n" << joined(v);
        std::vector<Transfers> models{Transfers::kBuffered, Transfers::kStreamPerDirection};
        if (V == 1) models.push_back(Transfers::kOneStream);
        for (auto transfers : models) {
          const SimResult r = simulate(s, {}, transfers);
          ASSERT_TRUE(r.ok) << what << " transfers " << static_cast<int>(transfers) << "\n"
                            << r.deadlock_reason;
          EXPECT_EQ(r.max_live_activations, std::vector<int>(static_cast<size_t>(R), 0)) << what;
          // Every rank forwards each micro-batch once per stage it holds.
          for (double busy : r.busy) EXPECT_EQ(busy, static_cast<double>(m * V)) << what;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 52);
}

TEST(Rules, ForwardOnlyIsNoTrainingScheduleAndHasNoBackward) {
  // As a training schedule it lacks every backward; forward only, a backward is the violation.
  const auto as_training = validate(make_forward_only_schedule(2, 2), 2, 2);
  EXPECT_TRUE(mentions(as_training, "stage 0: micro-batch 0 backwarded 0 times"))
      << joined(as_training);
  const auto v = validate(make_schedule(ScheduleKind::kGPipe, 1, 2), 1, 2, {true, false, true});
  EXPECT_TRUE(mentions(v, "rank 0 action #2 '0RECV_B0<-1': backward work in a forward-only"))
      << joined(v);
  EXPECT_TRUE(mentions(v, "rank 1 action #2 '1B0': backward work in a forward-only")) << joined(v);
  const auto missing = validate(ranks({"0F0", "1RECV_F0<-0 1F0"}), 1, 2, {true, false, true});
  EXPECT_TRUE(mentions(missing, "stage 0: micro-batch 0 sends its activation to the next stage 0"))
      << joined(missing);
}

TEST(Rules, ComputeOnlyScheduleMissesItsCommunication) {
  const auto v = validate(gpipe_schedule(2, 2), 2, 2);
  EXPECT_TRUE(mentions(v, "rank 1 action #0 '1F0': F before its RECV_F")) << joined(v);
  EXPECT_TRUE(validate(gpipe_schedule(2, 2), 2, 2, {false, false}).empty());
}

// Zero-bubble schedules (split backwards) on 1F1B, GPipe and interleaved bases.

struct SplitCosts {
  ZeroBubbleCosts zb;
  SimCosts split;    // B = input_backward, W = weight_backward
  SimCosts unsplit;  // B = input_backward + weight_backward, no W
};

SplitCosts split_costs(std::vector<double> f, std::vector<double> b, std::vector<double> w,
                       double comm) {
  std::vector<double> whole(b.size());
  for (size_t s = 0; s < b.size(); ++s) whole[s] = b[s] + w[s];
  return {ZeroBubbleCosts{f, b, w, comm}, SimCosts{f, b, w, comm}, SimCosts{f, whole, {}, comm}};
}

TEST(Rules, ZeroBubbleSchedulesAreValidKeepTheBaseOrderAndBeatTheUnsplitBase) {
  int checked = 0;
  for (int R : {2, 3, 4}) {
    for (int V : {1, 2}) {
      const int n = R * V;
      // Uniform costs, W cheaper than B, and stages that differ (the last one heaviest, as with
      // the LM head), each with and without a transfer cost.
      std::vector<SplitCosts> cost_sets;
      for (double comm : {0.0, 0.25}) {
        cost_sets.push_back(split_costs(std::vector<double>(n, 1), std::vector<double>(n, 1),
                                        std::vector<double>(n, 1), comm));
        cost_sets.push_back(split_costs(std::vector<double>(n, 1), std::vector<double>(n, 1.2),
                                        std::vector<double>(n, 0.6), comm));
        std::vector<double> f(n), b(n), w(n);
        for (int s = 0; s < n; ++s) {
          f[s] = 1.0 + 0.25 * s;
          b[s] = 1.0 + 0.1 * s;
          w[s] = 0.8 + 0.2 * (s % 2);
        }
        f[n - 1] += 1.0;
        cost_sets.push_back(split_costs(f, b, w, comm));
      }
      for (int m : {1, 2, 4, 8}) {
        std::vector<std::pair<std::string, Schedule>> bases;
        if (V == 1) {
          bases.emplace_back("1f1b", one_f_one_b_schedule(m, n));
          bases.emplace_back("gpipe", gpipe_schedule(m, n));
        } else if (m % R == 0) {
          bases.emplace_back("interleaved", interleaved_schedule(m, R, V));
        }
        for (const auto& [name, base] : bases) {
          for (size_t c = 0; c < cost_sets.size() * 3; ++c) {
            // Each cost set at the base's memory, one extra live micro-batch, and no limit.
            const int extra = std::vector<int>{0, 1, kNoLiveLimit}[c % 3];
            const std::string what = name + " R=" + std::to_string(R) + " V=" + std::to_string(V) +
                                     " m=" + std::to_string(m) + " costs #" +
                                     std::to_string(c / 3) + " extra_live " + std::to_string(extra);
            const SplitCosts& costs = cost_sets[c / 3];
            const Schedule zb = zero_bubble_schedule(base, costs.zb, extra);
            ASSERT_EQ(zb.size(), base.size()) << what;
            for (int r = 0; r < R; ++r) {
              // The F/B subsequence is the base list; every W follows its own B, once.
              RankActions fb;
              std::set<std::pair<int, int>> backwarded, weighted;
              for (const Action& a : zb[r]) {
                if (a.op != Action::Op::kWeight) {
                  fb.push_back(a);
                  if (a.op == Action::Op::kBackward) backwarded.insert({a.stage, a.microbatch});
                  continue;
                }
                EXPECT_EQ(backwarded.count({a.stage, a.microbatch}), 1u) << what << " " << a;
                EXPECT_TRUE(weighted.insert({a.stage, a.microbatch}).second) << what << " " << a;
              }
              EXPECT_EQ(to_string(fb), to_string(base[r])) << what << " rank " << r;
              EXPECT_EQ(weighted, backwarded) << what << " rank " << r;
            }
            const Schedule with_comm = add_communication(zb, n);
            const auto v = validate(with_comm, m, n);
            ASSERT_TRUE(v.empty()) << what << "\n" << joined(v) << to_string(with_comm);
            const SimResult split =
                simulate(with_comm, costs.split, Transfers::kStreamPerDirection);
            ASSERT_TRUE(split.ok) << what << "\n" << split.deadlock_reason;
            EXPECT_TRUE(simulate(with_comm, costs.split).ok) << what;
            // Memory: what the simulator counts live, within the peak of the base's busiest rank
            // + extra_live.
            const std::vector<int> peak = peak_live(zb), base_peak = peak_live(base);
            EXPECT_EQ(split.max_live_activations, peak) << what;
            const int base_max = *std::max_element(base_peak.begin(), base_peak.end());
            for (int r = 0; r < R && extra != kNoLiveLimit; ++r) {
              EXPECT_LE(peak[r], base_max + extra) << what << " rank " << r;
            }
            const SimResult unsplit =
                simulate(add_communication(base, n), costs.unsplit, Transfers::kStreamPerDirection);
            ASSERT_TRUE(unsplit.ok) << what;
            EXPECT_LE(split.makespan, unsplit.makespan + 1e-9) << what << "\n" << to_string(zb);
            // The same work, only moved: busy time per rank does not change.
            for (int r = 0; r < R; ++r) {
              EXPECT_NEAR(split.busy[r], unsplit.busy[r], 1e-9) << what << " rank " << r;
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 450);
}

// The classic case: 1F1B on 2 stages, 4 micro-batches, F = B = W = 1. Unsplit (B + W = 2) it
// takes (m + n - 1) (F + B + W) = 15. Split, stage 1 runs F/B back to back from 1 to 9 and its
// four W's after, ending at 13; stage 0 fills its cool-down wait for 1B3 with 0W0 and also ends
// at 13 instead of idling 2 units at the end.
TEST(Simulate, ZeroBubbleFillsTheOneFOneBCooldown) {
  const SplitCosts costs = split_costs({1, 1}, {1, 1}, {1, 1}, 0.0);
  const Schedule base = one_f_one_b_schedule(4, 2);
  const Schedule zb = zero_bubble_schedule(base, costs.zb, kNoLiveLimit);
  const SimResult unsplit =
      simulate(add_communication(base, 2), costs.unsplit, Transfers::kStreamPerDirection);
  const SimResult split =
      simulate(add_communication(zb, 2), costs.split, Transfers::kStreamPerDirection);
  ASSERT_TRUE(split.ok) << split.deadlock_reason;
  EXPECT_DOUBLE_EQ(unsplit.makespan, 15.0);
  EXPECT_LT(split.makespan, unsplit.makespan) << to_string(zb);
  EXPECT_DOUBLE_EQ(split.makespan, 13.0);
  EXPECT_LT(split.bubble_fraction, unsplit.bubble_fraction);
  // Rank 0 runs a W in a wait for stage 1's B before its last B.
  const RankActions& r0 = zb[0];
  const auto last_b = std::find(r0.begin(), r0.end(), parse_action("0B3"));
  ASSERT_NE(last_b, r0.end());
  EXPECT_NE(std::find(r0.begin(), last_b, parse_action("0W0")), last_b) << to_string(r0);
}

// The same at 1F1B's peak memory (the default), as ZB-H1: no rank holds more than 1F1B's first
// stage (2 micro-batches). Stage 1 now runs a W before each F beyond its second instead of all
// four at the end. The step is as short as without a limit, which holds 4 on both stages.
TEST(Simulate, ZeroBubbleAtTheBaseMemoryKeepsTheGain) {
  const SplitCosts costs = split_costs({1, 1}, {1, 1}, {1, 1}, 0.0);
  const Schedule base = one_f_one_b_schedule(4, 2);
  const Schedule zb = zero_bubble_schedule(base, costs.zb);
  EXPECT_EQ(to_string(zb[1]), "1F0 1B0 1F1 1B1 1W0 1F2 1B2 1W1 1F3 1B3 1W2 1W3");
  const SimResult split =
      simulate(add_communication(zb, 2), costs.split, Transfers::kStreamPerDirection);
  ASSERT_TRUE(split.ok) << split.deadlock_reason;
  EXPECT_EQ(split.max_live_activations, (std::vector<int>{2, 2})) << to_string(zb);
  EXPECT_DOUBLE_EQ(split.makespan, 13.0) << to_string(zb);
  const SimResult unlimited =
      simulate(add_communication(zero_bubble_schedule(base, costs.zb, kNoLiveLimit), 2),
               costs.split, Transfers::kStreamPerDirection);
  EXPECT_DOUBLE_EQ(unlimited.makespan, 13.0);
  EXPECT_EQ(unlimited.max_live_activations, (std::vector<int>{4, 4}));
}

TEST(Simulate, WeightActionsCostTheirOwnTimeAndWaitForNoTransfer) {
  // Defaults: F 1, B 2, W 1. Rank 1's W runs right after its B (it needs no receive), while
  // rank 0 waits for 1B0's gradient.
  const Schedule s = ranks({
      "0F0 0SEND_F0->1 0RECV_B0<-1 0B0 0W0",
      "1RECV_F0<-0 1F0 1B0 1SEND_B0->0 1W0",
  });
  for (auto transfers : {Transfers::kBuffered, Transfers::kStreamPerDirection}) {
    const SimResult r = simulate(s, {}, transfers);
    ASSERT_TRUE(r.ok) << r.deadlock_reason;
    EXPECT_DOUBLE_EQ(r.timings[1][4].start, 4.0);  // 1W0 after 1B0 [2,4]
    EXPECT_DOUBLE_EQ(r.timings[1][4].end, 5.0);
    EXPECT_DOUBLE_EQ(r.timings[0][4].start, 6.0);  // 0W0 after 0B0 [4,6]
    EXPECT_DOUBLE_EQ(r.makespan, 7.0);
    EXPECT_EQ(r.busy, (std::vector<double>{4.0, 4.0}));
    EXPECT_NEAR(r.bubble_fraction, 1.0 - 8.0 / 14.0, 1e-12);
  }
  SimCosts heavy_w{{}, {}, {3.0, 0.5}, 0.0};
  const SimResult r = simulate(s, heavy_w, Transfers::kStreamPerDirection);
  ASSERT_TRUE(r.ok) << r.deadlock_reason;
  EXPECT_DOUBLE_EQ(r.makespan, 9.0);  // 0W0 [6,9]
  EXPECT_EQ(r.busy, (std::vector<double>{6.0, 3.5}));
  SimCosts wrong{{}, {}, {1.0}, 0.0};
  EXPECT_NE(error_of([&] { simulate(s, wrong); }).find("weight costs have 1 entries for 2 stages"),
            std::string::npos);
  SimCosts negative{{}, {}, {1.0, -2.0}, 0.0};
  EXPECT_NE(error_of([&] { simulate(s, negative); }).find("weight cost of stage 1 is -2"),
            std::string::npos);
}

TEST(Simulate, WeightActionsHoldTheActivationsAlive) {
  // With W actions an activation lives until its W: #F - #W, not #F - #B.
  const Schedule split = ranks({"0F0 0B0 0F1 0B1 0W0 0W1"});
  const Schedule whole = ranks({"0F0 0B0 0F1 0B1"});
  for (auto transfers : {Transfers::kBuffered, Transfers::kStreamPerDirection}) {
    EXPECT_EQ(simulate(split, {}, transfers).max_live_activations, std::vector<int>{2});
    EXPECT_EQ(simulate(whole, {}, transfers).max_live_activations, std::vector<int>{1});
  }
  EXPECT_TRUE(validate(split, 2, 1).empty()) << joined(validate(split, 2, 1));
  const auto v = validate(split, 2, 1, {true, true});
  EXPECT_TRUE(mentions(v, "rank 0 action #2 '0F1': 2 activations alive; 1F1B allows at most 1"))
      << joined(v);
}

TEST(Rules, WeightActionViolations) {
  const auto check = [](const std::string& list, int m, const std::string& text) {
    const auto v = validate(ranks({list}), m, 1);
    EXPECT_TRUE(mentions(v, text)) << list << "\n" << joined(v);
  };
  check("0F0 0W0 0B0", 1, "rank 0 action #1 '0W0': W before its B");
  check("0W0 0F0 0B0", 1, "rank 0 action #0 '0W0': W before its B");
  check("0F0 0B0 0W0 0F1 0B1", 2, "stage 0: micro-batch 1 gets its weight gradients (W) 0 times");
  check("0F0 0B0 0W0 0W0", 1, "rank 0 action #3 '0W0': a second W of this micro-batch");
  check("0F0 0B0 0W0 0W0", 1, "stage 0: micro-batch 0 gets its weight gradients (W) 2 times");
  // A W on one rank means every rank's B needs its W.
  const auto v = validate(add_communication(ranks({"0F0 0B0 0W0", "1F0 1B0"}), 2), 1, 2);
  EXPECT_TRUE(mentions(v, "stage 1: micro-batch 0 gets its weight gradients (W) 0 times"))
      << joined(v);
  // Valid: one W per B after it, also in a compute-only check; no W at all is valid as before.
  EXPECT_TRUE(validate(ranks({"0F0 0B0 0F1 0B1 0W1 0W0"}), 2, 1).empty());
  EXPECT_TRUE(
      validate(zero_bubble_schedule(one_f_one_b_schedule(2, 2), {{1, 1}, {1, 1}, {1, 1}, 0.0}), 2,
               2, {false, false})
          .empty());
  EXPECT_TRUE(validate(ranks({"0F0 0B0 0F1 0B1"}), 2, 1).empty());
}

}  // namespace
}  // namespace gpt2p::pipeline
