#include "gpt2p/parallel/train_common.h"

#include <cstdio>
#include <vector>

namespace gpt2p::parallel {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

DeviceBatch to_device(const data::Batch& b, const torch::Device& device) {
  const std::vector<int64_t> shape{b.batch_size, b.seq_len};
  auto copy = [&](const void* ptr, torch::ScalarType t) {
    auto host = torch::from_blob(const_cast<void*>(ptr), shape, t);
    if (device.is_cuda()) return host.pin_memory().to(device, /*non_blocking=*/true);
    return host.clone();
  };
  return {copy(b.inputs.data(), torch::kInt64), copy(b.labels.data(), torch::kInt64),
          copy(b.mask.data(), torch::kFloat32)};
}

std::string format_eta(double seconds) {
  const auto s = static_cast<long long>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lldh%02lldm%02llds", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

void print_progress(int64_t epoch, int epochs, int64_t batch, int64_t per_epoch, double loss,
                    double tokens_per_sec, double eta_seconds) {
  std::printf("epoch %lld/%d step %lld/%lld loss %.4f tok/s %.0f (all ranks) eta %s\n",
              static_cast<long long>(epoch + 1), epochs, static_cast<long long>(batch + 1),
              static_cast<long long>(per_epoch), loss, tokens_per_sec, format_eta(eta_seconds).c_str());
  std::fflush(stdout);
}

void print_epoch_time(int64_t epoch, int rank, double train_time, int64_t tokens) {
  std::printf("Epoch %lld on Rank %d: Training Time = %.4f, Tokens_per_sec = %.1f\n",
              static_cast<long long>(epoch), rank, train_time, static_cast<double>(tokens) / train_time);
  std::fflush(stdout);
}

}  // namespace gpt2p::parallel
