// Splitting a dataset over data-parallel ranks and walking it in batches, as HW5 does.
//
// Every rank builds the same DataPartitioner from the same seed, so all ranks agree on the
// partition without communicating. Shuffles are our own Fisher-Yates over std::mt19937_64 (whose
// output the standard fixes), never std::shuffle (whose algorithm differs between libraries), so a
// seed means the same order on every machine.
#pragma once

#include <cstdint>
#include <vector>

namespace gpt2p::data {

// Seeded Fisher-Yates permutation of 0..n-1 (identical on every platform for the same seed).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

class DataPartitioner {
 public:
  // Shuffles 0..n-1 with `seed`, then cuts it into consecutive parts of size
  // floor(fraction * n) (HW5's int(frac * data_len)); fractions must be > 0 and sum to <= 1.
  DataPartitioner(int64_t n, const std::vector<double>& fractions, uint64_t seed);

  // The indices of partition `part`.
  const std::vector<int64_t>& use(int part) const;
  int parts() const { return static_cast<int>(parts_.size()); }

 private:
  std::vector<std::vector<int64_t>> parts_;
};

struct RankPartition {
  std::vector<int64_t> indices;  // this rank's examples
  int64_t local_batch = 0;       // global_batch / world
};

// Equal fractions 1/world over n examples; throws when global_batch % world != 0.
RankPartition partition_dataset(int rank, int world, int64_t n, int64_t global_batch,
                                uint64_t seed);

// Where a BatchSampler is: the next batch to produce is batch `batch` of epoch `epoch`.
struct SamplerPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const SamplerPosition& o) const { return epoch == o.epoch && batch == o.batch; }
};

// Epochs of batches over a fixed index list. Epoch e visits `indices` in the order
// seeded_permutation(n, seed + e) (so epoch orders differ, yet are fixed by seed and e), cut into
// batches of `batch_size`; with drop_last the last short batch is skipped.
class BatchSampler {
 public:
  BatchSampler(std::vector<int64_t> indices, int64_t batch_size, uint64_t seed,
               bool drop_last = true);

  int64_t batches_per_epoch() const;
  // Batch `index` of epoch `epoch` (does not move the position).
  std::vector<int64_t> batch(int64_t epoch, int64_t index) const;

  // The batch at position(), then advances (to batch 0 of the next epoch after the last one).
  std::vector<int64_t> next();
  SamplerPosition position() const { return pos_; }
  // Resume: the next call of next() returns batch `p.batch` of epoch `p.epoch`.
  void set_position(const SamplerPosition& p);

 private:
  const std::vector<int64_t>& order(int64_t epoch) const;

  std::vector<int64_t> indices_;
  int64_t batch_size_;
  uint64_t seed_;
  bool drop_last_;
  SamplerPosition pos_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

}  // namespace gpt2p::data
