// How a job ends when something goes wrong on some of its ranks: start-up checks agreed over all
// ranks (one report, one exit code), ranks started with different configurations, and waits on
// a peer that does not come, which must throw after the timeout instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpt2p/cli/config_agreement.h"
#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/comm/mpi_communicator.h"
#include "gpt2p/core/error.h"
#include "gpt2p/core/mpi_wait.h"
#include "gpt2p/core/roll_call.h"
#include "gpt2p/parallel/train/options.h"

namespace gpt2p {
namespace {

using namespace std::chrono_literals;

Topology world() { return query_topology(MPI_COMM_WORLD); }

TEST(OnEveryRank, PassesWhenNoRankFails) {
  int runs = 0;
  EXPECT_NO_THROW(cli::on_every_rank([&] { ++runs; }));
  EXPECT_EQ(runs, 1);
}

// The last rank alone finds bad usage: every rank ends with exit 2 and only it reports.
TEST(OnEveryRank, OneRanksUsageErrorEndsEveryRankWithOneReport) {
  const auto t = world();
  try {
    cli::on_every_rank([&] {
      if (t.rank == t.size - 1) throw cli::UsageError("--data /nope.h5: no such file");
    });
    ADD_FAILURE() << "every rank must throw";
  } catch (const cli::AgreedFailure& e) {
    EXPECT_EQ(e.code, cli::kExitUsage);
    EXPECT_EQ(e.reporter, t.rank == t.size - 1);
    if (e.reporter) {
      EXPECT_NE(std::string(e.what()).find("--data /nope.h5"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(t.rank)), std::string::npos)
          << e.what();
    }
  }
}

// Several ranks fail: the lowest failing rank reports; a runtime error on any rank is code 1
// unless a usage error (2) is among them.
TEST(OnEveryRank, TheLowestFailingRankReports) {
  const auto t = world();
  try {
    cli::on_every_rank([&] {
      if (t.rank >= 1) GPT2P_FAIL("rank " << t.rank << " cannot read its file", "check it");
    });
    ADD_FAILURE() << "every rank must throw";
  } catch (const cli::AgreedFailure& e) {
    EXPECT_EQ(e.code, cli::kExitError);
    EXPECT_EQ(e.reporter, t.rank == 1);
  }
}

TEST(ConfigAgreement, NamesTheFlagsThatDiffer) {
  parallel::TrainConfig a;
  parallel::TrainConfig b;
  b.optim.batch_size = 32;
  b.comm.timeout_s = 5;
  const auto text = cli::describe_config_difference(parallel::to_json(b), parallel::to_json(a), 0);
  EXPECT_NE(text.find("--batch-size 32, rank 0 with -1"), std::string::npos) << text;
  EXPECT_NE(text.find("--comm-timeout 5"), std::string::npos) << text;
  EXPECT_EQ(cli::describe_config_difference(parallel::to_json(a), parallel::to_json(a), 0), "");
}

TEST(ConfigAgreement, SameConfigurationsPass) {
  parallel::TrainConfig c;
  EXPECT_NO_THROW(cli::check_same_config(parallel::to_json(c)));
}

// Rank 1 runs another batch size and seed: the job ends with exit 2 on every rank, and rank 1
// says which flags differ.
TEST(ConfigAgreement, DifferentFlagsEndTheJobNamingThem) {
  const auto t = world();
  parallel::TrainConfig c;
  if (t.rank == 1) {
    c.optim.batch_size = 32;
    c.optim.seed = 4;
  }
  try {
    cli::check_same_config(parallel::to_json(c));
    ADD_FAILURE() << "different configurations must end the job";
  } catch (const cli::AgreedFailure& e) {
    EXPECT_EQ(e.code, cli::kExitUsage);
    EXPECT_EQ(e.reporter, t.rank == 1);
    if (e.reporter) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--batch-size 32, rank 0 with -1"), std::string::npos) << what;
      EXPECT_NE(what.find("--seed 4"), std::string::npos) << what;
    }
  }
}

// A peer that is late past the timeout: the wait throws naming the operation, the peer and the
// timeout; once the peer comes, the same Work completes.
TEST(MpiTimeout, ARecvFromALatePeerThrowsThenCompletes) {
  const auto t = world();
  comm::MpiOptions o;
  o.timeout = 300ms;
  comm::MpiCommunicator comm(MPI_COMM_WORLD, o);
  auto x = torch::zeros({4});
  if (t.rank == 0) {
    auto work = comm.recv_async(x, 1, 7);
    try {
      work->wait();
      ADD_FAILURE() << "the recv must time out";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("recv with rank 1"), std::string::npos) << what;
      EXPECT_NE(what.find("not complete after 0.3 s"), std::string::npos) << what;
      EXPECT_NE(what.find("--comm-timeout"), std::string::npos) << what;
    }
    // Rank 1 sends after 0.8 s: waiting again (each wait with its own 0.3 s) completes the Work.
    bool done = false;
    for (int attempt = 0; attempt < 50 && !done; ++attempt) {
      try {
        work->wait();
        done = true;
      } catch (const Error&) {
      }
    }
    ASSERT_TRUE(done);
    EXPECT_TRUE(torch::equal(x, torch::full({4}, 3.0)));
  } else if (t.rank == 1) {
    std::this_thread::sleep_for(800ms);
    comm.send(torch::full({4}, 3.0), 0, 7);
  }
  comm::MpiOptions patient;
  comm::MpiCommunicator(MPI_COMM_WORLD, patient).barrier();
}

TEST(MpiTimeout, ABarrierWithoutTheLastRankThrows) {
  const auto t = world();
  MPI_Comm dup = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  if (t.rank != t.size - 1) {
    try {
      barrier(dup, 200ms, "test barrier");
      ADD_FAILURE() << "the barrier must time out";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("test barrier (MPI barrier): not complete after 0.2 s"),
                std::string::npos)
          << what;
      // The roll call names the rank that is away and its host; the others answer it.
      // ("rank 2 on h did not ...", or "ranks 1-2 on h did not ..." when another earlier rank
      // happened to be away from MPI just then.)
      const std::string late = std::to_string(t.size - 1) + " on " +
                               RollCall::active()->hosts()[t.size - 1] +
                               " did not answer a roll call within 0.2 s";
      EXPECT_NE(what.find(late), std::string::npos) << what;
    }
  } else {
    std::this_thread::sleep_for(600ms);
  }
  // The late rank joins now: the earlier ranks' barrier requests complete with it.
  if (t.rank == t.size - 1) barrier(dup, 10s, "late barrier");
  std::this_thread::sleep_for(100ms);
  comm::MpiCommunicator(MPI_COMM_WORLD).barrier();
  MPI_Comm_free(&dup);
}

// A peer that waits in another MPI call is alive: it answers the roll call, and the message says
// that no rank is dead or cut off.
TEST(MpiTimeout, RanksWaitingInOtherCallsAnswerTheRollCall) {
  const auto t = world();
  comm::MpiOptions o;
  o.timeout = 300ms;
  comm::MpiCommunicator comm(MPI_COMM_WORLD, o);
  MPI_Comm dup = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  auto x = torch::zeros({2});
  if (t.rank == 0) {
    auto work = comm.recv_async(x, 1, 11);
    try {
      work->wait();
      ADD_FAILURE() << "the recv must time out";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("every other rank answered a roll call within 0.2 s"), std::string::npos)
          << what;
    }
    barrier(dup, 10s, "release");
    work->wait();
    EXPECT_TRUE(torch::equal(x, torch::full({2}, 5.0)));
  } else {
    barrier(dup, 10s, "release");  // waits for rank 0, answering its roll call meanwhile
    if (t.rank == 1) comm.send(torch::full({2}, 5.0), 0, 11);
  }
  comm::MpiCommunicator(MPI_COMM_WORLD).barrier();
  MPI_Comm_free(&dup);
}

TEST(RollCall, KnowsEveryRanksHost) {
  const auto t = world();
  ASSERT_NE(RollCall::active(), nullptr);
  ASSERT_EQ(static_cast<int>(RollCall::active()->hosts().size()), t.size);
  EXPECT_EQ(RollCall::active()->hosts()[t.rank], t.host);
  MPI_Comm dup = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  EXPECT_TRUE(RollCall::active()->missing(5s).empty());  // every rank calls: all answer
  // A rank done with its own call keeps answering the others' (in a wait of ours) until they are
  // done too.
  barrier(dup, 10s, "after the roll call");
  MPI_Comm_free(&dup);
}

}  // namespace
}  // namespace gpt2p
