// The training data of one data-parallel rank: the prepared dataset, this rank's partition of the
// first --max-train-pairs training pairs, and its batches, epoch after epoch.
//
// Every rank computes every rank's batch order (cheap: index lists), so each knows the global
// batch's target-token count without communicating. The loss of a rank is then
// sum(masked CE) * world / global_target_tokens, and averaging gradients over ranks gives exactly
// the gradient of the mean over all target tokens of the global batch, as one rank would compute
// it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpt2p/data/batch.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/partitioner.h"

namespace gpt2p::parallel {

struct TrainDataOptions {
  std::string path;
  std::string tokenizer_identity;
  int32_t vocab_size = 0;
  int64_t max_train_pairs = 0;  // 0 = all
  int64_t global_batch = 0;
  int64_t seq_len = 0;
  uint64_t seed = 0;
};

class TrainData {
 public:
  TrainData(const TrainDataOptions& options, int rank, int world);

  int64_t local_batch() const { return local_batch_; }
  int64_t batches_per_epoch() const { return samplers_[rank_].batches_per_epoch(); }
  int64_t train_pairs() const { return train_pairs_; }

  struct Step {
    data::Batch batch;             // this rank's sequences
    int64_t global_target_tokens;  // target tokens of all ranks' batches of this step
  };
  // This rank's next batch (and every rank's sampler moves on in lockstep).
  Step next();
  data::SamplerPosition position() const { return samplers_[rank_].position(); }
  void set_position(const data::SamplerPosition& p);

  const data::DatasetFile& dataset() const { return file_; }
  // What the run trains on, for a checkpoint to record and a resume to compare: the tokenizer's
  // identity and a 64-bit FNV-1a hash (hex) of the training split's arrays.
  const std::string& tokenizer_identity() const { return tokenizer_identity_; }
  const std::string& train_fingerprint() const { return train_fingerprint_; }
  const data::SpecialTokens& special() const { return file_.meta().special; }
  int64_t seq_len() const { return seq_len_; }
  // The share of the training pairs' positions whose loss counts (data::target_share).
  double target_fraction() const;

 private:
  data::DatasetFile file_;
  std::string tokenizer_identity_, train_fingerprint_;
  int rank_;
  int64_t seq_len_;
  int64_t local_batch_ = 0;
  int64_t train_pairs_ = 0;
  std::vector<data::BatchSampler> samplers_;  // one per rank
  std::vector<int64_t> target_tokens_;        // per training example
};

}  // namespace gpt2p::parallel
