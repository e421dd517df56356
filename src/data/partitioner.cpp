#include "gpt2p/data/partitioner.h"

#include <cmath>
#include <numeric>
#include <random>

#include "gpt2p/core/error.h"

namespace gpt2p::data {

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  GPT2P_CHECK(n >= 0, "cannot permute " << n << " items", "pass a non-negative size");
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937_64 rng(seed);
  // Fisher-Yates from the back; j uniform in [0, i] by rejection (no modulo bias, and no
  // std::uniform_int_distribution, whose algorithm is implementation-defined).
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t range = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t r;
    do {
      r = rng();
    } while (r >= limit);
    std::swap(p[i], p[r % range]);
  }
  return p;
}

DataPartitioner::DataPartitioner(int64_t n, const std::vector<double>& fractions, uint64_t seed) {
  GPT2P_CHECK(!fractions.empty(), "no partition fractions given", "pass e.g. {0.5, 0.5}");
  double total = 0;
  for (const double f : fractions) {
    GPT2P_CHECK(f > 0, "partition fraction " << f << " is not positive",
                "pass fractions > 0 that sum to at most 1");
    total += f;
  }
  GPT2P_CHECK(total <= 1.0 + 1e-9, "partition fractions sum to " << total << " > 1",
              "pass fractions that sum to at most 1");
  const auto perm = seeded_permutation(n, seed);
  size_t start = 0;
  for (const double f : fractions) {
    // HW5: int(frac * data_len); the epsilon keeps e.g. (1/3) * 3 from flooring to 0.
    const auto len = std::min(static_cast<size_t>(std::floor(f * static_cast<double>(n) + 1e-9)),
                              perm.size() - start);
    parts_.emplace_back(perm.begin() + static_cast<int64_t>(start),
                        perm.begin() + static_cast<int64_t>(start + len));
    start += len;
  }
}

const std::vector<int64_t>& DataPartitioner::use(int part) const {
  GPT2P_CHECK(part >= 0 && part < parts(),
              "partition " << part << " does not exist (there are " << parts() << ")",
              "use a rank in [0, world size)");
  return parts_[static_cast<size_t>(part)];
}

RankPartition partition_dataset(int rank, int world, int64_t n, int64_t global_batch,
                                uint64_t seed) {
  GPT2P_CHECK(world >= 1 && rank >= 0 && rank < world,
              "rank " << rank << " is not in a world of " << world, "this is a launcher bug");
  GPT2P_CHECK(global_batch >= 1 && global_batch % world == 0,
              "global batch size " << global_batch << " does not divide over " << world << " ranks",
              "pass --batch-size as a positive multiple of the number of ranks (e.g. "
                  << world * std::max<int64_t>(1, global_batch / world) << ")");
  DataPartitioner partitioner(n, std::vector<double>(static_cast<size_t>(world), 1.0 / world),
                              seed);
  return {partitioner.use(rank), global_batch / world};
}

BatchSampler::BatchSampler(std::vector<int64_t> indices, int64_t batch_size, uint64_t seed,
                           bool drop_last)
    : indices_(std::move(indices)), batch_size_(batch_size), seed_(seed), drop_last_(drop_last) {
  GPT2P_CHECK(batch_size_ >= 1, "batch size " << batch_size_ << " is not positive",
              "pass a local batch size >= 1");
  GPT2P_CHECK(batches_per_epoch() > 0,
              "no batches: " << indices_.size() << " examples are fewer than one batch of "
                             << batch_size_ << " (drop_last)",
              "use a smaller batch size or more data");
}

int64_t BatchSampler::batches_per_epoch() const {
  const auto n = static_cast<int64_t>(indices_.size());
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

const std::vector<int64_t>& BatchSampler::order(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    const auto perm = seeded_permutation(static_cast<int64_t>(indices_.size()),
                                         seed_ + static_cast<uint64_t>(epoch));
    cached_order_.resize(perm.size());
    for (size_t i = 0; i < perm.size(); ++i)
      cached_order_[i] = indices_[static_cast<size_t>(perm[i])];
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

std::vector<int64_t> BatchSampler::batch(int64_t epoch, int64_t index) const {
  GPT2P_CHECK(epoch >= 0 && index >= 0 && index < batches_per_epoch(),
              "batch " << index << " of epoch " << epoch << " does not exist ("
                       << batches_per_epoch() << " batches per epoch)",
              "use a position within the epoch");
  const auto& o = order(epoch);
  const auto begin = static_cast<size_t>(index * batch_size_);
  const auto end = std::min(o.size(), begin + static_cast<size_t>(batch_size_));
  return {o.begin() + static_cast<int64_t>(begin), o.begin() + static_cast<int64_t>(end)};
}

std::vector<int64_t> BatchSampler::next() {
  auto b = batch(pos_.epoch, pos_.batch);
  if (++pos_.batch == batches_per_epoch()) {
    pos_.batch = 0;
    ++pos_.epoch;
  }
  return b;
}

void BatchSampler::set_position(const SamplerPosition& p) {
  GPT2P_CHECK(p.epoch >= 0 && p.batch >= 0 && p.batch < batches_per_epoch(),
              "cannot resume at epoch " << p.epoch << " batch " << p.batch << ": an epoch has "
                                        << batches_per_epoch() << " batches",
              "resume with the same data, world size and batch size as the checkpoint");
  pos_ = p;
}

}  // namespace gpt2p::data
