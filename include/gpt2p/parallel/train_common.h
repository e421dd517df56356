// Pieces every training loop shares (trainer.cpp for data parallelism, pp_trainer.cpp for
// pipelines): clocks, batches on the device, progress lines.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "gpt2p/data/batch.h"

namespace gpt2p::parallel {

using Clock = std::chrono::steady_clock;

// Seconds from t0 to now (host clock).
double since(Clock::time_point t0);

struct DeviceBatch {
  torch::Tensor inputs, labels, mask;  // [B, T]: int64, int64, float32
};
// Copies a host batch to `device` (pinned, non-blocking on CUDA).
DeviceBatch to_device(const data::Batch& b, const torch::Device& device);

// "1h02m03s".
std::string format_eta(double seconds);

// Rank 0's progress line: "epoch E/N step B/P loss L tok/s X (all ranks) eta ...".
void print_progress(int64_t epoch, int epochs, int64_t batch, int64_t per_epoch, double loss,
                    double tokens_per_sec, double eta_seconds);

// HW5's per-rank line: "Epoch {e} on Rank {r}: Training Time = {t}, Tokens_per_sec = {x}".
void print_epoch_time(int64_t epoch, int rank, double train_time, int64_t tokens);

}  // namespace gpt2p::parallel
