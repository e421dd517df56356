#include "gpt2p/model/gpt2.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "gpt2p/compat/device.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/core/error.h"
#include "gpt2p/model/recompute.h"
#if GPT2P_WITH_CUDA
#include "gpt2p/kernels/fused_norm.h"
#endif

namespace gpt2p::model {

namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------------------------
// GPT2
// ---------------------------------------------------------------------------------------------
GPT2Impl::GPT2Impl(const GPT2Config& config)
    : GPT2Impl(config, LayerRange{0, static_cast<int>(config.num_stage_layers())}) {}

GPT2Impl::GPT2Impl(const GPT2Config& config, LayerRange range) : config_(config), range_(range) {
  config_.validate();
  const int64_t n = config_.num_stage_layers();
  GPT2P_CHECK(range_.begin >= 0 && range_.begin < range_.end && range_.end <= n,
              "layer range [" << range.begin << ", " << range.end << ") is not a non-empty part of "
                              << "the model's " << n << " layers [0, " << n << ")",
              "layer 0 is the embedding, 1.." << config_.n_layer << " the blocks, " << n - 1
                                              << " the head; pass begin < end <= " << n);
  if (has_embedding() || has_head()) {
    wte = register_module("wte", torch::nn::Embedding(config_.padded_vocab_size(), config_.n_embd));
  }
  if (has_embedding()) {
    wpe = register_module("wpe", torch::nn::Embedding(config_.n_ctx, config_.n_embd));
    drop_ = register_module("drop", torch::nn::Dropout(config_.dropout));
  }
  const int64_t first_block = std::max<int64_t>(range_.begin, 1);
  const int64_t last_block = std::min<int64_t>(range_.end, config_.n_layer + 1);
  if (first_block < last_block) {
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> blocks;
    for (int64_t layer = first_block; layer < last_block; ++layer) {
      blocks.emplace_back(std::to_string(layer - 1), Block(config_).ptr());
    }
    h = register_module("h", torch::nn::ModuleDict(blocks));
  }
  if (has_head()) {
    ln_f = register_module(
        "ln_f", torch::nn::LayerNorm(
                    torch::nn::LayerNormOptions({config_.n_embd}).eps(config_.layer_norm_eps)));
  }
  reset_parameters(0);
}

namespace {

// The token lookup whose backward hands (ids, output gradient) to a sink instead of returning a
// weight gradient. The anchor, a 0-element tensor that requires grad, is what makes autograd call
// backward at all; the weight arrives detached, so there is no edge to wte.
class SinkedLookup : public torch::autograd::Function<SinkedLookup> {
 public:
  // saved_data holds IValues; a capsule carries the sink.
  struct SinkHolder : torch::CustomClassHolder {
    explicit SinkHolder(std::shared_ptr<GPT2Impl::EmbeddingGradSink> s) : sink(std::move(s)) {}
    std::shared_ptr<GPT2Impl::EmbeddingGradSink> sink;
  };

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& anchor,
                               const torch::Tensor& ids, const torch::Tensor& weight,
                               const std::shared_ptr<GPT2Impl::EmbeddingGradSink>& sink) {
    (void)anchor;
    ctx->saved_data["sink"] = c10::IValue::make_capsule(c10::make_intrusive<SinkHolder>(sink));
    ctx->save_for_backward({ids});
    return weight.index_select(0, ids.reshape({-1}))
        .view({ids.size(0), ids.size(1), weight.size(1)});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto ids = ctx->get_saved_variables()[0];
    const auto capsule = ctx->saved_data["sink"].toCapsule();
    const auto* holder = dynamic_cast<const SinkHolder*>(capsule.get());
    GPT2P_CHECK(holder != nullptr, "embedding backward lost its gradient sink", "this is a bug");
    (*holder->sink)(ids, grads[0]);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};  // one per argument
  }
};

}  // namespace

void GPT2Impl::set_embedding_grad_sink(EmbeddingGradSink sink) {
  GPT2P_CHECK(has_embedding(), "set_embedding_grad_sink() on a stage without the embedding",
              "set the sink on the stage that holds layer 0");
  if (!sink) {
    sink_.reset();
    sink_anchor_ = torch::Tensor();
    return;
  }
  sink_ = std::make_shared<EmbeddingGradSink>(std::move(sink));
  sink_anchor_ = torch::zeros({0}, wte->weight.options()).requires_grad_(true);
}

void GPT2Impl::set_kernels(Kernels kernels) {
  GPT2P_CHECK(kernels != Kernels::kAuto, "set_kernels(kAuto): the request is not resolved",
              "pass model::resolve_kernels(requested, cuda_device, capability)");
  kernels_ = kernels;
  if (!h) return;
  for (const auto& block : h->values()) {
    auto* b = block->as<BlockImpl>();
    b->attn->kernels = kernels;
    b->mlp->kernels = kernels;
  }
}

void GPT2Impl::set_grad_accumulation(bool on) {
  const char* env = std::getenv("GPT2P_GEMM_ACCUMULATE");
  if (env != nullptr && std::string(env) == "0") on = false;
  accumulate_grads_ = on;  // ln_f and the head's wte gradient
  if (!h) return;
  for (const auto& block : h->values()) {
    auto* b = block->as<BlockImpl>();
    b->accumulate_grads = on;
    b->attn->accumulate_grads = on;
    b->mlp->accumulate_grads = on;
  }
}

void GPT2Impl::set_weight_grad_store(std::shared_ptr<WeightGradStore> store) {
  if (!h) return;
  for (const auto& block : h->values()) {
    auto* b = block->as<BlockImpl>();
    b->attn->weight_grads = store;
    b->mlp->weight_grads = store;
  }
}

torch::Tensor GPT2Impl::forward(const torch::Tensor& x) {
  const auto hidden = features(x);
  return has_head() ? torch::linear(hidden, wte->weight) : hidden;
}

torch::ScalarType autocast_type(Precision precision) {
  switch (precision) {
    case Precision::kBf16: return torch::kBFloat16;
    case Precision::kFp16: return torch::kHalf;
    case Precision::kFp32:
    case Precision::kTf32: break;
  }
  return torch::kFloat32;
}

torch::Tensor GPT2Impl::loss(const torch::Tensor& x, const LossRows& rows,
                             torch::ScalarType autocast, int64_t chunk_rows) {
  GPT2P_CHECK(has_head(),
              "loss() on the stage [" << range_.begin << ", " << range_.end
                                      << ") that does not hold the head",
              "compute the loss on the last stage");
  const auto hidden = features(x);
  const auto flat = hidden.reshape({-1, hidden.size(-1)}).index_select(0, rows.index);
  return linear_cross_entropy(flat, wte->weight, rows.labels, rows.weights, config_.vocab_size,
                              autocast == torch::kFloat32 ? wte->weight.scalar_type() : autocast,
                              chunk_rows, kernels_, accumulate_grads_);
}

torch::Tensor GPT2Impl::features(const torch::Tensor& x) {
  torch::Tensor hidden;
  if (has_embedding()) {
    GPT2P_CHECK(x.dim() == 2 && x.scalar_type() == torch::kLong,
                "GPT-2 embedding stage expects token ids [B,T] int64, got " << x.sizes() << " "
                                                                            << x.scalar_type(),
                "pass a [batch, seq_len] tensor of dtype torch::kLong");
    const int64_t t = x.size(1);
    GPT2P_CHECK(t <= config_.n_ctx,
                "sequence length " << t << " exceeds the model's context n_ctx = " << config_.n_ctx,
                "cut sequences to at most " << config_.n_ctx << " tokens or use a larger n_ctx");
    const auto pos =
        torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
    // The plain lookup's backward hands autograd a dense [vocabulary, C] gradient per backward,
    // which a stage of M micro-batches fills, scatters and adds M times. Adding the rows into
    // .grad with index_put_ (accumulate) instead runs each id's repeats in one warp: padded pairs
    // repeat the pad id thousands of times, and it took 10.6 ms a step at 16 x 1024 on an H100
    // (results/2026-12-07-h100-stage-grad-adds).
    const auto tokens =
        sink_ ? SinkedLookup::apply(sink_anchor_, x, wte->weight.detach(), sink_) : wte(x);
    hidden = drop_(tokens + wpe(pos));
  } else {
    GPT2P_CHECK(x.dim() == 3 && x.size(2) == config_.n_embd,
                "GPT-2 stage [" << range_.begin << ", " << range_.end
                                << ") expects hidden states [B,T," << config_.n_embd << "], got "
                                << x.sizes(),
                "feed it the output of the previous stage");
    hidden = x;
  }
  // Blocks pass on (hidden, -), or fused (residual, delta): float32 residuals, each add inside the
  // next LayerNorm. kBlocks in training: only their inputs are kept, backward reruns them.
  const bool fused = kernels_ == Kernels::kFused && hidden.is_cuda();
  const auto out_type =
      fused ? compat::autocast_dtype(hidden.device(), hidden.scalar_type()) : hidden.scalar_type();
  std::vector<torch::Tensor> state{fused ? hidden.to(torch::kFloat32) : hidden, torch::Tensor()};
  const bool recompute = recompute_ == Recompute::kBlocks && is_training();
  if (h) {
    for (const auto& block : h->values()) {
      const CheckpointFn run = [block, fused, out_type](const std::vector<torch::Tensor>& in) {
        auto* b = block->as<BlockImpl>();
        if (!fused) return std::vector<torch::Tensor>{b->forward(in[0]), torch::Tensor()};
        auto out = b->forward_fused(in[0], in[1], out_type);
        return std::vector<torch::Tensor>{std::move(out.first), std::move(out.second)};
      };
      state = recompute ? checkpointed(run, state, block->parameters()) : run(state);
    }
  }
  const torch::Tensor &residual = state[0], &delta = state[1];
  if (!fused) return has_head() ? ln_f(residual) : residual;
  if (has_head()) {
#if GPT2P_WITH_CUDA
    return kernels::add_layer_norm(residual, delta, ln_f->weight, ln_f->bias, ln_f->options.eps(),
                                   out_type, accumulate_grads_)[1];
#endif
  }
  return delta.defined() ? residual + delta : residual;
}

namespace {
// Fills `p` from `gen` in float32 on the CPU, then copies (any device/dtype): same values anywhere.
void init_normal(torch::Tensor p, double std, at::Generator& gen) {
  auto tmp = torch::empty(p.sizes(), torch::kFloat32);
  tmp.normal_(0.0, std, gen);
  p.copy_(tmp);
}

void init_layer_norm(const torch::nn::LayerNorm& ln) {
  ln->weight.fill_(1.0);
  ln->bias.zero_();
}

void init_linear(const torch::nn::Linear& lin, double std, at::Generator& gen) {
  init_normal(lin->weight, std, gen);
  lin->bias.zero_();
}

constexpr double kInitStd = 0.02;
constexpr uint64_t kLayerSeedStride = 1000003;
}  // namespace

void GPT2Impl::reset_parameters(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto layer_gen = [&](int64_t layer) {
    return compat::make_cpu_generator(seed * kLayerSeedStride + static_cast<uint64_t>(layer));
  };
  if (wte) {  // layer 0's generator, so the head's copy equals the embedding's
    auto gen = layer_gen(0);
    init_normal(wte->weight, kInitStd, gen);
    wte->weight.narrow(0, config_.vocab_size, config_.padded_vocab_size() - config_.vocab_size)
        .zero_();
    if (wpe) init_normal(wpe->weight, kInitStd, gen);
  }
  const double resid_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  if (h) {
    for (const auto& item : h->items()) {
      auto gen = layer_gen(std::stoll(item.first) + 1);
      auto* block = item.second->as<BlockImpl>();
      init_layer_norm(block->ln_1);
      init_linear(block->attn->c_attn, kInitStd, gen);
      init_linear(block->attn->c_proj, resid_std, gen);
      init_layer_norm(block->ln_2);
      init_linear(block->mlp->c_fc, kInitStd, gen);
      init_linear(block->mlp->c_proj, resid_std, gen);
    }
  }
  if (ln_f) init_layer_norm(ln_f);
}

torch::Tensor GPT2Impl::tied_parameter() const { return wte ? wte->weight : torch::Tensor(); }

torch::Tensor GPT2Impl::lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                const torch::Tensor& mask) const {
  return model::lm_loss(logits, labels, mask, config_.vocab_size);
}

torch::Tensor GPT2Impl::lm_loss_all(const torch::Tensor& logits, const torch::Tensor& ids) const {
  return model::lm_loss_all(logits, ids, config_.vocab_size);
}

// ---------------------------------------------------------------------------------------------
// Losses
// ---------------------------------------------------------------------------------------------
namespace {
// Per-position cross-entropy over the first vocab_size columns, flattened, float32.
torch::Tensor token_losses(const torch::Tensor& logits, const torch::Tensor& targets,
                           int64_t vocab_size) {
  GPT2P_CHECK(logits.dim() == 3 && logits.size(2) >= vocab_size,
              "logits " << logits.sizes() << " are not [B,T,V] with V >= vocab_size " << vocab_size,
              "pass the output of the model's head");
  GPT2P_CHECK(targets.sizes() == logits.sizes().slice(0, 2),
              "labels " << targets.sizes() << " do not match logits " << logits.sizes(),
              "labels must be [B,T] like the logits' first two dimensions");
  const auto real = logits.narrow(2, 0, vocab_size).to(torch::kFloat32).reshape({-1, vocab_size});
  return F::cross_entropy(real, targets.reshape({-1}).to(torch::kLong),
                          F::CrossEntropyFuncOptions().reduction(torch::kNone));
}
}  // namespace

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                      const torch::Tensor& mask, int64_t vocab_size) {
  GPT2P_CHECK(mask.sizes() == labels.sizes(),
              "loss mask " << mask.sizes() << " does not match labels " << labels.sizes(),
              "pass a [B,T] mask with 1 where the label counts");
  const auto keep = mask.to(logits.device()).to(torch::kFloat32).reshape({-1});
  // Labels under mask 0 may be anything (padding, -100): make them valid, their loss is dropped.
  const auto safe = labels.to(logits.device()).masked_fill(mask.to(logits.device()) == 0, 0);
  const auto losses = token_losses(logits, safe, vocab_size);
  return (losses * keep).sum() / keep.sum().clamp_min(1.0);
}

torch::Tensor lm_loss_all_sum(const torch::Tensor& logits, const torch::Tensor& ids,
                              int64_t vocab_size) {
  const int64_t t = logits.size(1);
  GPT2P_CHECK(t >= 2, "a loss over shifted ids needs sequences of >= 2 tokens, got " << t,
              "drop sequences shorter than 2 tokens");
  const auto shifted = logits.narrow(1, 0, t - 1);
  const auto targets = ids.to(logits.device()).narrow(1, 1, t - 1);
  return token_losses(shifted, targets, vocab_size).sum();
}

torch::Tensor lm_loss_all(const torch::Tensor& logits, const torch::Tensor& ids,
                          int64_t vocab_size) {
  const int64_t n = logits.size(0) * (logits.size(1) - 1);
  return lm_loss_all_sum(logits, ids, vocab_size) / static_cast<double>(std::max<int64_t>(n, 1));
}

}  // namespace gpt2p::model
