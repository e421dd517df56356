// Data partitions over ranks and the resumable epoch batch order.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/data/partitioner.h"
#include "support/errors.h"

namespace gpt2p::data {
namespace {

using gpt2p::testing::error_with_hint;

TEST(Permutation, IsAPermutationAndSeeded) {
  const auto p = seeded_permutation(1000, 7);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(seeded_permutation(1000, 7), p);
  EXPECT_NE(seeded_permutation(1000, 8), p);
  EXPECT_TRUE(seeded_permutation(0, 1).empty());
  EXPECT_EQ(seeded_permutation(1, 1), std::vector<int64_t>{0});
}

TEST(Permutation, EngineIsTheStandardOne) {
  // The standard fixes mt19937_64's output ([rand.predef]: 10000th value of the default seed),
  // which is what makes our orders the same on every platform.
  std::mt19937_64 rng;
  rng.discard(9999);
  EXPECT_EQ(rng(), 9981545732273789042ULL);
}

TEST(Permutation, RoughlyUniform) {
  // Where item 0 lands over 4000 seeds, for n = 4: each slot about 1000 times.
  std::vector<int> count(4, 0);
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    const auto p = seeded_permutation(4, seed);
    ++count[std::find(p.begin(), p.end(), 0) - p.begin()];
  }
  for (const int c : count) EXPECT_NEAR(c, 1000, 120);
}

TEST(Partitioner, HalvesLikeHw5) {
  DataPartitioner part(10, {0.5, 0.5}, 1234);
  ASSERT_EQ(part.parts(), 2);
  EXPECT_EQ(part.use(0).size(), 5U);
  EXPECT_EQ(part.use(1).size(), 5U);
  const auto perm = seeded_permutation(10, 1234);
  EXPECT_EQ(part.use(0), std::vector<int64_t>(perm.begin(), perm.begin() + 5));
  EXPECT_EQ(part.use(1), std::vector<int64_t>(perm.begin() + 5, perm.end()));
  // HW5 floors int(frac * n): 0.7/0.2/0.1 of 7 -> 4, 1, 0 (one left over, used by nobody).
  DataPartitioner uneven(7, {0.7, 0.2, 0.1}, 1);
  EXPECT_EQ(uneven.use(0).size(), 4U);
  EXPECT_EQ(uneven.use(1).size(), 1U);
  EXPECT_EQ(uneven.use(2).size(), 0U);
  const auto text = error_with_hint([&] { part.use(2); });
  EXPECT_NE(text.find("partition 2 does not exist (there are 2)"), std::string::npos) << text;
  EXPECT_NE(error_with_hint([] {
              DataPartitioner(4, {0.7, 0.7}, 1);
            }).find("sum to 1.4 > 1"),
            std::string::npos);
}

TEST(Partitioner, DisjointAndCoveringForAllSizes) {
  for (const int64_t n : {64, 128, 512}) {
    for (const int world : {2, 4, 8}) {
      std::set<int64_t> seen;
      for (int rank = 0; rank < world; ++rank) {
        const auto p = partition_dataset(rank, world, n, 8 * world, 42);
        EXPECT_EQ(static_cast<int64_t>(p.indices.size()), n / world);
        EXPECT_EQ(p.local_batch, 8);
        for (const int64_t i : p.indices) {
          EXPECT_TRUE(i >= 0 && i < n);
          EXPECT_TRUE(seen.insert(i).second)
              << "index " << i << " in two partitions, n=" << n << " world=" << world;
        }
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "n=" << n << " world=" << world;
    }
  }
}

TEST(Partitioner, SameSeedSameDifferentSeedDifferent) {
  for (const int world : {2, 4, 8}) {
    for (int rank = 0; rank < world; ++rank) {
      const auto a = partition_dataset(rank, world, 512, 64, 1234).indices;
      EXPECT_EQ(partition_dataset(rank, world, 512, 64, 1234).indices, a);
      EXPECT_NE(partition_dataset(rank, world, 512, 64, 4321).indices, a);
    }
  }
}

TEST(Partitioner, BatchMustDivide) {
  const auto text = error_with_hint([] { partition_dataset(0, 4, 128, 30, 1); });
  EXPECT_NE(text.find("global batch size 30 does not divide over 4 ranks"), std::string::npos)
      << text;
  EXPECT_NE(text.find("multiple of the number of ranks (e.g. 28)"), std::string::npos) << text;
  EXPECT_NE(error_with_hint([] {
              partition_dataset(4, 4, 128, 32, 1);
            }).find("rank 4 is not in a world of 4"),
            std::string::npos);
}

TEST(BatchSampler, EpochsCoverIndicesAndDiffer) {
  std::vector<int64_t> idx;
  for (int64_t i = 100; i < 110; ++i) idx.push_back(i);
  BatchSampler s(idx, 3, 5);
  EXPECT_EQ(s.batches_per_epoch(), 3);  // 10 / 3, last short batch dropped
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (int b = 0; b < 3; ++b) epoch0.push_back(s.next());
  EXPECT_EQ(s.position(), (SamplerPosition{1, 0}));
  for (int b = 0; b < 3; ++b) epoch1.push_back(s.next());
  EXPECT_NE(epoch0, epoch1);
  std::set<int64_t> seen;
  for (const auto& b : epoch0) {
    EXPECT_EQ(b.size(), 3U);
    for (const int64_t i : b) {
      EXPECT_TRUE(i >= 100 && i < 110);
      EXPECT_TRUE(seen.insert(i).second);
    }
  }
  EXPECT_EQ(seen.size(), 9U);
  BatchSampler keep_last(idx, 3, 5, /*drop_last=*/false);
  EXPECT_EQ(keep_last.batches_per_epoch(), 4);
  EXPECT_EQ(keep_last.batch(0, 3).size(), 1U);
  EXPECT_EQ(keep_last.batch(0, 0), epoch0[0]);
}

TEST(BatchSampler, ResumeGivesTheSameSequence) {
  std::vector<int64_t> idx(50);
  for (int64_t i = 0; i < 50; ++i) idx[i] = i;
  BatchSampler a(idx, 4, 99);
  std::vector<std::vector<int64_t>> run;
  for (int i = 0; i < 30; ++i) run.push_back(a.next());
  BatchSampler b(idx, 4, 99);
  for (int i = 0; i < 17; ++i) b.next();
  const SamplerPosition saved = b.position();
  EXPECT_EQ(saved, (SamplerPosition{1, 5}));  // 12 batches per epoch
  BatchSampler c(idx, 4, 99);
  c.set_position(saved);
  for (int i = 17; i < 30; ++i) EXPECT_EQ(c.next(), run[i]) << "batch " << i;
  const auto text = error_with_hint([&] { c.set_position({0, 12}); });
  EXPECT_NE(text.find("cannot resume at epoch 0 batch 12: an epoch has 12 batches"),
            std::string::npos)
      << text;
}

TEST(BatchSampler, TooFewExamples) {
  const auto text = error_with_hint([] { BatchSampler({1, 2}, 4, 0); });
  EXPECT_NE(text.find("2 examples are fewer than one batch of 4"), std::string::npos) << text;
}

}  // namespace
}  // namespace gpt2p::data
