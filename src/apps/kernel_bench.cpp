// kernel_bench: each of the project's CUDA kernels beside the reference path it replaces, at
// GPT-2 124M's training shapes, one line each (median of timed repetitions, CUDA events).
//
//   kernel_bench [ROWS]        ROWS: head positions (default 16384 = 16 x 1024)
//
// Lines: the softmax/cross-entropy/gradient pass over one 4096-row chunk of logits, and the
// whole LM head with its gradients (linear_cross_entropy) over ROWS positions, bf16 and fp32.
// Exit status 2 for bad arguments, 1 without a GPU.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gpt2p/compat/device.h"
#include "gpt2p/compat/version.h"
#include "gpt2p/kernels/fused_head.h"
#include "gpt2p/model/config.h"
#include "gpt2p/model/lm_head_loss.h"

namespace {

using namespace gpt2p;

const torch::Device kGpu(torch::kCUDA, 0);

// Median milliseconds of `reps` runs of f after `warm` untimed ones.
double time_ms(const std::function<void()>& f, int warm = 3, int reps = 15) {
  for (int i = 0; i < warm; ++i) f();
  compat::DeviceClock clock(kGpu, 2);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    clock.mark(0);
    f();
    clock.mark(1);
    ms.push_back(1e3 * clock.elapsed(0, 1));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void line(const char* what, const char* type, double reference_ms, double fused_ms) {
  std::printf("%-44s %-5s %10.3f %10.3f %8.2fx\n", what, type, reference_ms, fused_ms,
              reference_ms / fused_ms);
  std::fflush(stdout);
}

// The reference path's elementwise work on one chunk of logits: what the kernel replaces.
void reference_pass(const torch::Tensor& logits, const torch::Tensor& labels,
                    const torch::Tensor& weights, int64_t vocab, torch::ScalarType compute) {
  auto l = logits.clone();
  l.narrow(1, vocab, l.size(1) - vocab).fill_(-INFINITY);
  auto logp = torch::log_softmax(l, 1, torch::kFloat32);
  const auto target = labels.unsqueeze(1);
  const auto target_logp = logp.gather(1, target);
  auto loss = -(target_logp.squeeze(1) * weights).sum();
  auto g = logp.exp_();
  g.scatter_(1, target, target_logp.exp() - 1.0);
  auto gc = g.to(compute);
  (void)loss;
}

int run(int64_t rows) {
  const auto config = model::preset("gpt2");
  const int64_t c = config.n_embd, vocab = config.vocab_size, padded = config.padded_vocab_size();
  compat::set_strict_fp32(true);
  torch::manual_seed(0);
  const auto opts = torch::TensorOptions().device(kGpu);
  std::printf(
      "# kernel_bench on %s, torch %s: GPT-2 124M head, vocab %lld (%lld padded), %lld "
      "positions\n",
      compat::device_name(kGpu).c_str(), compat::torch_version(), static_cast<long long>(vocab),
      static_cast<long long>(padded), static_cast<long long>(rows));
  std::printf("%-44s %-5s %10s %10s %9s\n", "# what", "type", "ref ms", "fused ms", "speed-up");
  for (auto type : {torch::kBFloat16, torch::kFloat32}) {
    const char* name = type == torch::kBFloat16 ? "bf16" : "fp32";
    const int64_t chunk = std::min<int64_t>(model::kLossChunkRows, rows);
    const auto logits = torch::randn({chunk, padded}, opts).mul_(2).to(type);
    const auto labels = torch::randint(0, vocab, {chunk}, opts.dtype(torch::kLong));
    const auto weights = torch::rand({chunk}, opts);
    auto work = logits.clone();
    const double ref = time_ms([&] { reference_pass(logits, labels, weights, vocab, type); });
    const double fused = time_ms([&] {
      work.copy_(logits);
      kernels::softmax_cross_entropy_(work, labels, weights, vocab, true);
    });
    const double copy = time_ms([&] { work.copy_(logits); });
    line(("softmax + CE + grad, " + std::to_string(chunk) + " rows").c_str(), name, ref,
         std::max(fused - copy, 1e-3));

    const auto hidden = torch::randn({rows, c}, opts).requires_grad_(true);
    const auto weight = (torch::randn({padded, c}, opts) * 0.02).requires_grad_(true);
    const auto all_labels = torch::randint(0, vocab, {rows}, opts.dtype(torch::kLong));
    const auto all_weights = torch::full({rows}, 1.0 / static_cast<double>(rows), opts);
    auto head = [&](model::Kernels k) {
      return [&, k] {
        auto loss = model::linear_cross_entropy(hidden, weight, all_labels, all_weights, vocab,
                                                type, model::kLossChunkRows, k);
        loss.backward();
        hidden.mutable_grad() = torch::Tensor();
        weight.mutable_grad() = torch::Tensor();
      };
    };
    line(("LM head fwd + bwd, " + std::to_string(rows) + " positions").c_str(), name,
         time_ms(head(model::Kernels::kReference)), time_ms(head(model::Kernels::kFused)));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 16384;
  if (argc > 2 || (argc == 2 && (rows = std::atoll(argv[1])) <= 0)) {
    std::fprintf(stderr,
                 "usage: kernel_bench [ROWS]  (ROWS: a positive number of head positions)\n");
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "kernel_bench: no GPU visible -- run it on a machine with a CUDA GPU\n");
    return 1;
  }
  try {
    return run(rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: error: %s\n", e.what());
    return 1;
  }
}
