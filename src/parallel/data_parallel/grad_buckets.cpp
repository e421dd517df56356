#include "gpt2p/parallel/data_parallel/grad_buckets.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "gpt2p/core/error.h"

namespace gpt2p::parallel {
namespace {
int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
}  // namespace

GradBuckets::GradBuckets(const std::vector<torch::Tensor>& params, const BucketOptions& options,
                         Ready on_ready, bool hooks)
    : on_ready_(std::move(on_ready)), hooks_(hooks) {
  GPT2P_CHECK(!params.empty(), "no parameters to put in gradient buckets", "this is a bug");
  GPT2P_CHECK(options.bucket_mb > 0, "--bucket-mb " << options.bucket_mb << " is not positive",
              "pass a bucket size in MiB, e.g. 25");
  GPT2P_CHECK(options.align >= 1 && options.parts >= 1,
              "gradient buckets need align >= 1 and parts >= 1", "this is a bug");
  const auto bytes_per = static_cast<int64_t>(torch::elementSize(options.dtype));
  const auto capacity =
      std::max<int64_t>(1, static_cast<int64_t>(options.bucket_mb * 1024 * 1024) / bytes_per);
  const int64_t align = options.align;
  const auto add = [&](const torch::Tensor& p, bool new_bucket) {
    if (new_bucket && (buckets_.empty() || buckets_.back().numel > 0)) buckets_.emplace_back();
    auto& b = buckets_.back();
    const int64_t offset = round_up(b.numel, align);
    slots_.push_back({p, buckets_.size() - 1, offset, false, 0});
    b.slots.push_back(slots_.size() - 1);
    b.numel = offset + p.numel();
  };
  if (options.alone.defined()) {
    GPT2P_CHECK(std::any_of(params.begin(), params.end(),
                            [&](const torch::Tensor& p) { return p.is_same(options.alone); }),
                "the parameter to bucket alone is not among the parameters", "this is a bug");
    add(options.alone, true);
  }
  bool after_alone = options.alone.defined();
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (options.alone.defined() && it->is_same(options.alone)) continue;
    const bool full =
        buckets_.empty() || round_up(buckets_.back().numel, align) + it->numel() > capacity;
    add(*it, full || after_alone);
    after_alone = false;
  }
  const int64_t unit = align * options.parts;
  for (auto& b : buckets_) {
    b.numel = round_up(b.numel, unit);
    b.flat = torch::zeros(
        {b.numel}, torch::TensorOptions().dtype(options.dtype).device(params.front().device()));
  }
  if (!hooks) return;
  for (size_t s = 0; s < slots_.size(); ++s) {
    slots_[s].hook =
        slots_[s].param.register_hook([this, s](const torch::Tensor& grad) { on_grad(s, grad); });
  }
}

GradBuckets::~GradBuckets() {
  if (!hooks_) return;
  for (auto& s : slots_) s.param.remove_hook(s.hook);
}

void GradBuckets::arm(bool sync) {
  for (auto& slot : slots_) {
    auto& g = slot.param.mutable_grad();
    if (g.defined() && g.is_alias_of(buckets_[slot.bucket].flat)) g = g.clone();
  }
  armed_ = sync;
  if (!sync) return;
  for (auto& b : buckets_) {
    b.pending = static_cast<int64_t>(b.slots.size());
    b.launched = false;
  }
  for (auto& s : slots_) s.filled = false;
}

void GradBuckets::finish_backward() {
  if (!armed_) return;
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    auto& b = buckets_[bi];
    if (b.launched) continue;
    for (size_t s : b.slots) {
      if (!slots_[s].filled) fill(s, torch::Tensor());
    }
    ready(bi);
  }
  armed_ = false;
}

void GradBuckets::fill_all() {
  arm(true);
  finish_backward();
}

torch::Tensor GradBuckets::view(const torch::Tensor& flat, size_t s) const {
  const auto& slot = slots_[s];
  return flat.narrow(0, slot.offset, slot.param.numel()).view_as(slot.param);
}

int64_t GradBuckets::total_numel() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.numel;
  return n;
}

void GradBuckets::on_grad(size_t s, const torch::Tensor& grad) {
  // An undefined gradient is none yet (a deferred weight's, zero-bubble's W adds it later):
  // finish_backward() takes .grad then.
  if (!armed_ || slots_[s].filled || !grad.defined()) return;
  fill(s, grad);
  auto& b = buckets_[slots_[s].bucket];
  if (--b.pending == 0) ready(slots_[s].bucket);
}

// Copies .grad (earlier micro-steps) + grad (this one) into the slot's part of its bucket.
void GradBuckets::fill(size_t s, const torch::Tensor& grad) {
  auto& slot = slots_[s];
  auto dst = buckets_[slot.bucket].flat.narrow(0, slot.offset, slot.param.numel());
  const auto& acc = slot.param.grad();
  if (grad.defined() && acc.defined()) {
    dst.copy_((acc + grad).reshape({-1}));
  } else if (grad.defined()) {
    dst.copy_(grad.reshape({-1}));
  } else if (acc.defined()) {
    dst.copy_(acc.reshape({-1}));
  } else {
    dst.zero_();
  }
  slot.filled = true;
}

void GradBuckets::ready(size_t bucket) {
  buckets_[bucket].launched = true;
  on_ready_(bucket);
}

void LookupGrads::add(const torch::Tensor& ids, const torch::Tensor& grad, bool gather) {
  ids_.push_back(ids.reshape({-1}));
  grads_.push_back(grad.reshape({-1, grad.size(-1)}).to(dtype_));
  if (!gather) return;
  const auto cat = [](std::vector<torch::Tensor>& parts) {
    auto all = parts.size() == 1 ? parts.front().contiguous() : torch::cat(parts);
    parts.clear();
    return all;
  };
  gather_ids_ = cat(ids_);
  gather_grads_ = cat(grads_);
  const int64_t world = comm_->size();
  ids_all_ = torch::empty({world, gather_ids_.size(0)}, gather_ids_.options());
  grads_all_ =
      torch::empty({world, gather_grads_.size(0), gather_grads_.size(1)}, gather_grads_.options());
  ids_work_ = comm_->all_gather_async(gather_ids_, ids_all_);
  grads_work_ = comm_->all_gather_async(gather_grads_, grads_all_);
}

torch::Tensor LookupGrads::dense(int64_t rows, torch::ScalarType dtype) {
  GPT2P_CHECK(grads_work_ != nullptr, "no token lookup gradients are being gathered",
              "this is a bug: call dense() after the syncing backward");
  ids_work_->wait();
  grads_work_->wait();
  const auto all = grads_all_.view({-1, grads_all_.size(-1)}).to(dtype);
  auto part = at::embedding_dense_backward(all, ids_all_.view({-1}), rows,
                                           /*padding_idx=*/-1, /*scale_grad_by_freq=*/false);
  ids_work_.reset();
  grads_work_.reset();
  gather_ids_ = gather_grads_ = ids_all_ = grads_all_ = torch::Tensor();
  return part;
}

}  // namespace gpt2p::parallel
