#include "gpt2p/model/lm_head_loss.h"

#include <algorithm>
#include <limits>

#include "gpt2p/compat/grad_into.h"
#include "gpt2p/core/error.h"
#if GPT2P_WITH_CUDA
#include "gpt2p/kernels/fused_head.h"
#endif

namespace gpt2p::model {

std::vector<LossRows> loss_rows(const torch::Tensor& labels, const torch::Tensor& mask, int parts,
                                double scale, LossPositions positions) {
  GPT2P_CHECK(labels.dim() == 2 && mask.sizes() == labels.sizes(),
              "loss_rows: labels " << labels.sizes() << " and mask " << mask.sizes()
                                   << " are not both [rows, T]",
              "pass the batch's labels and loss mask");
  GPT2P_CHECK(parts >= 1 && labels.size(0) % parts == 0,
              "loss_rows: " << labels.size(0) << " rows do not split into " << parts << " parts",
              "pick a number of micro-batches dividing the batch");
  const torch::Device device = labels.device();
  const auto host_mask = mask.to(torch::kCPU, torch::kFloat32).contiguous();
  const int64_t per_part = labels.numel() / parts;
  const auto flat_mask = host_mask.reshape({parts, per_part});
  const auto flat_labels = labels.reshape({parts, per_part});
  const auto to_device = [&](const torch::Tensor& host) {
    return device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host;
  };
  std::vector<LossRows> out;
  out.reserve(static_cast<size_t>(parts));
  for (int p = 0; p < parts; ++p) {
    const auto m = flat_mask[p];
    const auto index = positions == LossPositions::kTargets
                           ? m.nonzero().reshape({-1})
                           : torch::arange(per_part, torch::TensorOptions().dtype(torch::kInt64));
    const auto weights = m.index_select(0, index) * scale;
    LossRows rows;
    rows.index = to_device(index);
    rows.weights = to_device(weights);
    rows.labels = flat_labels[p].index_select(0, rows.index);
    if (positions == LossPositions::kAll) {  // labels under mask 0 may be anything: weight 0
      rows.labels = rows.labels.clamp(0, std::numeric_limits<int64_t>::max());
    }
    out.push_back(std::move(rows));
  }
  return out;
}

LossRows scaled(const LossRows& rows, double scale) {
  if (scale == 1.0) return rows;
  LossRows out = rows;
  out.weights = rows.weights * scale;
  return out;
}

namespace {

struct HeadResult {
  torch::Tensor loss, grad_hidden, grad_weight;
};

// The loss, and with `grads` the gradients of hidden and weight, chunk by chunk, with ATen ops.
HeadResult head_reference(const torch::Tensor& hidden, const torch::Tensor& weight,
                          const torch::Tensor& labels, const torch::Tensor& weights,
                          int64_t vocab_size, torch::ScalarType compute, int64_t chunk_rows,
                          bool grads) {
  const int64_t n = hidden.size(0), padded = weight.size(0);
  const auto w = weight.to(compute);
  const auto x = hidden.to(compute);
  const auto row_weights = weights.to(torch::kFloat32);
  HeadResult r;
  r.loss = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
  if (grads) {
    r.grad_hidden = torch::empty_like(hidden);
    r.grad_weight = torch::zeros_like(weight);
  }
  for (int64_t begin = 0; begin < n; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - begin);
    const auto xc = x.narrow(0, begin, rows);
    const auto wc = row_weights.narrow(0, begin, rows);
    const auto target = labels.narrow(0, begin, rows).unsqueeze(1);
    auto logp = [&] {
      auto logits = xc.mm(w.t());  // [rows, padded]
      if (padded > vocab_size) {
        logits.narrow(1, vocab_size, padded - vocab_size)
            .fill_(-std::numeric_limits<double>::infinity());
      }
      return torch::log_softmax(logits, 1, torch::kFloat32);
    }();
    const auto target_logp = logp.gather(1, target);  // [rows, 1]
    r.loss -= (target_logp.squeeze(1) * wc).sum();
    if (!grads) continue;
    // d loss_i / d logits_i = w_i (softmax_i - onehot(label_i)); w_i is applied to the GEMMs'
    // small operands instead of the [rows, padded] tensor.
    auto g = logp.exp_();
    g.scatter_(1, target, target_logp.exp() - 1.0);
    const auto gc = g.to(compute);
    r.grad_hidden.narrow(0, begin, rows).copy_(gc.mm(w) * wc.unsqueeze(1).to(compute));
    r.grad_weight.add_(gc.t().mm(xc * wc.unsqueeze(1).to(compute)));
  }
  return r;
}

#if GPT2P_WITH_CUDA
// The same with the kernels: per chunk one GEMM into a reused logits buffer, one kernel that
// turns it into the weighted gradient in place, and two GEMMs, the weight's accumulating in
// float32. The [rows, padded] tensor is touched three times instead of about ten.
HeadResult head_fused(const torch::Tensor& hidden, const torch::Tensor& weight,
                      const torch::Tensor& labels, const torch::Tensor& weights, int64_t vocab_size,
                      torch::ScalarType compute, int64_t chunk_rows, bool grads) {
  GPT2P_CHECK(hidden.is_cuda() && weight.is_cuda(),
              "the fused LM head runs on CUDA tensors, got hidden on "
                  << hidden.device() << " and weight on " << weight.device(),
              "pass --kernels reference for the CPU");
  const int64_t n = hidden.size(0), padded = weight.size(0);
  const auto w = weight.to(compute).contiguous();
  const auto x = hidden.to(compute).contiguous();
  const auto row_weights = weights.to(torch::kFloat32);
  HeadResult r;
  auto losses = torch::empty({n}, hidden.options().dtype(torch::kFloat32));
  torch::Tensor grad_weight;
  if (grads) {
    r.grad_hidden = torch::empty_like(hidden);
    // The first chunk's GEMM writes it, the others add: no zero fill (without rows, zeros).
    grad_weight = n == 0 ? torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32))
                         : torch::empty(weight.sizes(), weight.options().dtype(torch::kFloat32));
  }
  auto buffer = torch::empty({std::min(chunk_rows, n), padded}, x.options());
  for (int64_t begin = 0; begin < n; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - begin);
    const auto xc = x.narrow(0, begin, rows);
    auto logits = buffer.narrow(0, 0, rows);
    torch::mm_out(logits, xc, w.t());
    losses.narrow(0, begin, rows)
        .copy_(kernels::softmax_cross_entropy_(logits, labels.narrow(0, begin, rows),
                                               row_weights.narrow(0, begin, rows), vocab_size,
                                               grads));
    if (!grads) continue;
    auto gh = r.grad_hidden.narrow(0, begin, rows);
    if (gh.scalar_type() == compute) {
      torch::mm_out(gh, logits, w);
    } else {
      gh.copy_(logits.mm(w));
    }
    kernels::add_matmul_tn(grad_weight, logits, xc, /*add=*/begin > 0);
  }
  r.loss = losses.sum();
  if (grads) {
    r.grad_weight = grad_weight.scalar_type() == weight.scalar_type()
                        ? grad_weight
                        : grad_weight.to(weight.scalar_type());
  }
  return r;
}
#endif

HeadResult head_forward(const torch::Tensor& hidden, const torch::Tensor& weight,
                        const torch::Tensor& labels, const torch::Tensor& weights,
                        int64_t vocab_size, torch::ScalarType compute, int64_t chunk_rows,
                        bool grads, Kernels kernels) {
#if GPT2P_WITH_CUDA
  if (kernels == Kernels::kFused) {
    return head_fused(hidden, weight, labels, weights, vocab_size, compute, chunk_rows, grads);
  }
#else
  GPT2P_CHECK(kernels == Kernels::kReference,
              "the fused LM head is not in this build (its Torch has no CUDA)",
              "pass --kernels reference");
#endif
  return head_reference(hidden, weight, labels, weights, vocab_size, compute, chunk_rows, grads);
}

class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& labels,
                               const torch::Tensor& weights, int64_t vocab_size,
                               torch::ScalarType compute, int64_t chunk_rows, Kernels kernels,
                               bool accumulate_grad) {
    auto r = head_forward(hidden, weight, labels, weights, vocab_size, compute, chunk_rows,
                          /*grads=*/true, kernels);
    ctx->save_for_backward({r.grad_hidden, r.grad_weight});
    // The weight itself (a leaf), whose .grad backward adds into.
    if (accumulate_grad) ctx->saved_data["accumulate_into"] = weight;
    return r.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_output) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = grad_output[0];
    torch::Tensor grad_weight;
    const auto into = ctx->saved_data.find("accumulate_into");
    torch::Tensor weight_grad =
        into != ctx->saved_data.end()
            ? compat::grad_to_add_into(into->second.toTensor(), saved[1].device())
            : torch::Tensor();
    if (weight_grad.defined() && weight_grad.scalar_type() == saved[1].scalar_type()) {
      // One pass, .grad += saved * g, where autograd would scale into a new tensor and add it.
      torch::NoGradGuard no_grad;
      weight_grad.addcmul_(saved[1], g.to(saved[1].scalar_type()));
    } else {
      grad_weight = saved[1] * g.to(saved[1].scalar_type());
    }
    return {saved[0] * g.to(saved[0].scalar_type()),
            grad_weight,
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};  // one per argument of forward
  }
};

}  // namespace

torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, const torch::Tensor& weights,
                                   int64_t vocab_size, torch::ScalarType compute,
                                   int64_t chunk_rows, Kernels kernels, bool accumulate_grad) {
  GPT2P_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "linear_cross_entropy: hidden " << hidden.sizes() << " and weight " << weight.sizes()
                                              << " are not [n, C] and [V, C]",
              "pass the flattened final hidden states and the head's weight");
  GPT2P_CHECK(
      labels.dim() == 1 && labels.size(0) == hidden.size(0) && weights.sizes() == labels.sizes(),
      "linear_cross_entropy: labels " << labels.sizes() << " and weights " << weights.sizes()
                                      << " do not match hidden " << hidden.sizes(),
      "pass one label and one weight per row of hidden");
  GPT2P_CHECK(vocab_size >= 1 && vocab_size <= weight.size(0) && chunk_rows >= 1,
              "linear_cross_entropy: vocab_size " << vocab_size << " for a weight of "
                                                  << weight.size(0) << " rows, chunk of "
                                                  << chunk_rows << " rows",
              "pass 1 <= vocab_size <= the weight's rows and chunk_rows >= 1");
  const bool differentiable =
      torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (!differentiable) {
    return head_forward(hidden, weight, labels, weights, vocab_size, compute, chunk_rows,
                        /*grads=*/false, kernels)
        .loss;
  }
  return LinearCrossEntropy::apply(hidden, weight, labels, weights, vocab_size, compute, chunk_rows,
                                   kernels, accumulate_grad);
}

}  // namespace gpt2p::model
