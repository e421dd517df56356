#include "gpt2p/parallel/train/data.h"

#include <algorithm>
#include <cstdio>

#include "gpt2p/core/error.h"
#include "gpt2p/core/fnv1a.h"

namespace gpt2p::parallel {

namespace {

// 64-bit FNV-1a over the split's token, offset and length arrays, as 16 hex digits.
std::string fingerprint(const data::Split& split) {
  Fnv1a64 h;
  h.add(split.tokens().data(), split.tokens().size() * sizeof(int32_t));
  h.add(split.offsets().data(), split.offsets().size() * sizeof(int64_t));
  h.add(split.src_lengths().data(), split.src_lengths().size() * sizeof(int32_t));
  return h.hex();
}

}  // namespace

TrainData::TrainData(const TrainDataOptions& o, int rank, int world)
    : file_(data::DatasetFile::open(o.path)),
      tokenizer_identity_(o.tokenizer_identity),
      rank_(rank),
      seq_len_(o.seq_len) {
  file_.require_tokenizer(o.tokenizer_identity, o.vocab_size);
  // Evaluation needs pairs: an empty split would give a NaN loss and an exit 0.
  for (const char* name : {"validation", "test"}) {
    GPT2P_CHECK(file_.split(name).size() > 0,
                "dataset " << o.path << " has no " << name << " pairs",
                "re-create it with prepare_data, whose splits are never empty");
  }
  const auto& train = file_.split("train");
  train_fingerprint_ = fingerprint(train);
  train_pairs_ = o.max_train_pairs > 0 ? std::min(o.max_train_pairs, train.size()) : train.size();
  GPT2P_CHECK(train_pairs_ >= o.global_batch,
              "dataset " << o.path << " has " << train_pairs_ << " training pairs (after "
                         << "--max-train-pairs), fewer than one global batch of " << o.global_batch,
              "lower --batch-size or raise --max-train-pairs");
  // HW5 trains on the first N pairs; every rank partitions them the same way.
  for (int r = 0; r < world; ++r) {
    auto part = data::partition_dataset(r, world, train_pairs_, o.global_batch, o.seed);
    local_batch_ = part.local_batch;
    GPT2P_CHECK(static_cast<int64_t>(part.indices.size()) >= part.local_batch,
                "rank " << r << " gets " << part.indices.size()
                        << " pairs, fewer than its batch of " << part.local_batch,
                "use fewer ranks, a smaller --batch-size or more --max-train-pairs");
    samplers_.emplace_back(std::move(part.indices), part.local_batch, o.seed + 1 + r);
  }
  // Target tokens per example, exactly as make_batch will mask them.
  target_tokens_ = data::target_counts(train, train_pairs_, seq_len_, special());
}

double TrainData::target_fraction() const { return data::target_share(target_tokens_, seq_len_); }

TrainData::Step TrainData::next() {
  Step step{};
  int64_t global = 0;
  std::vector<int64_t> mine;
  for (size_t r = 0; r < samplers_.size(); ++r) {
    auto indices = samplers_[r].next();
    for (int64_t i : indices) global += target_tokens_[static_cast<size_t>(i)];
    if (static_cast<int>(r) == rank_) mine = std::move(indices);
  }
  step.batch = data::make_batch(file_.split("train"), mine, seq_len_, special());
  step.global_target_tokens = global;
  return step;
}

void TrainData::set_position(const data::SamplerPosition& p) {
  for (auto& s : samplers_) s.set_position(p);
}

}  // namespace gpt2p::parallel
