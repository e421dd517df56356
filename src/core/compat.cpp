#include "gpt2p/core/compat.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "gpt2p/core/error.h"

namespace gpt2p::compat {

torch::Tensor causal_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v) {
  const int64_t t_q = q.size(-2);
  const int64_t t_k = k.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto att = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const auto mask =
      torch::ones({t_q, t_k}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
          .triu(1);
  att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1);
  return torch::matmul(att, v);
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training) {
  const double p = training ? dropout_p : 0.0;
#if GPT2P_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  if (p == 0.0) return causal_attention_reference(q, k, v);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto att = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const auto mask = torch::ones({q.size(-2), k.size(-2)},
                                torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                        .triu(1);
  att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
  att = torch::dropout(att, p, /*train=*/true);
  return torch::matmul(att, v);
#endif
}

void set_attention_backend(const std::string& name) {
  const bool known = name == "auto" || name == "flash" || name == "cudnn" ||
                     name == "efficient" || name == "math";
  GPT2P_CHECK(known, "--attention " << name << " is not known",
              "pass --attention auto, flash, cudnn, efficient or math");
#if GPT2P_TORCH_AT_LEAST(2, 0)
  auto& ctx = at::globalContext();
  const bool all = name == "auto";
  ctx.setSDPUseFlash(all || name == "flash");
  ctx.setSDPUseMemEfficient(all || name == "efficient");
  ctx.setSDPUseMath(all || name == "math");
#if GPT2P_TORCH_AT_LEAST(2, 4)
  ctx.setSDPUseCuDNN(all || name == "cudnn");
#else
  GPT2P_CHECK(name != "cudnn",
              "--attention cudnn: libtorch " << TORCH_VERSION << " has no cuDNN attention",
              "pass --attention auto, flash, efficient or math, or use libtorch 2.4 or later");
#endif
#else
  GPT2P_CHECK(name == "auto" || name == "math",
              "--attention " << name << ": libtorch " << TORCH_VERSION
                             << " computes attention explicitly (no fused kernels)",
              "pass --attention auto, or build against libtorch 2.0 or later");
#endif
}

std::string attention_backend(const torch::Device& device, torch::ScalarType dtype, int64_t heads,
                              int64_t seq, int64_t head_dim, double dropout) {
#if GPT2P_TORCH_AT_LEAST(2, 0)
  const auto q = torch::empty({1, heads, seq, head_dim}, torch::TensorOptions().dtype(dtype).device(device));
  const int64_t choice = at::_fused_sdp_choice(q, q, q, /*attn_mask=*/{}, dropout, /*is_causal=*/true);
  switch (choice) {  // sdp::SDPBackend (ATen/native/transformers/sdp_utils_cpp.h)
    case 0: return "math";
    case 1: return "flash";
    case 2: return "efficient";
    case 3: return "cudnn";
    default: return "backend " + std::to_string(choice);
  }
#else
  (void)device, (void)dtype, (void)heads, (void)seq, (void)head_dim, (void)dropout;
  return "explicit";
#endif
}

const char* torch_version() { return TORCH_VERSION; }

at::Generator make_cpu_generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

std::string cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor state = gen.get_state().contiguous();
  return std::string(static_cast<const char*>(state.data_ptr()),
                     static_cast<size_t>(state.numel() * state.element_size()));
}

void set_cpu_rng_state(const std::string& bytes) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const int64_t expected =
      static_cast<int64_t>(cpu_rng_state().size());  // the state's size is fixed per version
  GPT2P_CHECK(static_cast<int64_t>(bytes.size()) == expected,
              "CPU RNG state has " << bytes.size() << " bytes, torch " << TORCH_VERSION
                                   << " expects " << expected,
              "the checkpoint was written by another libtorch version; resume without restoring "
              "the RNG state or use the same libtorch");
  auto state = torch::empty({expected}, torch::kUInt8);
  std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

namespace {
constexpr char kRngMagic[] = "gpt2p-rng-1";  // then the CPU state's length (8 bytes), CPU, device

at::Generator device_generator(const torch::Device& device) {
  return at::globalContext().defaultGenerator(device);
}
}  // namespace

std::string rng_state(const torch::Device& device) {
  const std::string cpu = cpu_rng_state();
  std::string out(kRngMagic, sizeof kRngMagic);
  const uint64_t n = cpu.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += cpu;
  if (device.is_cuda()) {
    at::Generator gen = device_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    const at::Tensor state = gen.get_state().contiguous();
    out.append(static_cast<const char*>(state.data_ptr()),
               static_cast<size_t>(state.numel() * state.element_size()));
  }
  return out;
}

void set_rng_state(const torch::Device& device, const std::string& bytes) {
  const size_t head = sizeof kRngMagic + sizeof(uint64_t);
  if (bytes.size() < head || bytes.compare(0, sizeof kRngMagic, std::string(kRngMagic, sizeof kRngMagic)) != 0) {
    set_cpu_rng_state(bytes);
    return;
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + sizeof kRngMagic, sizeof n);
  GPT2P_CHECK(bytes.size() >= head + n, "the RNG state is truncated (" << bytes.size() << " bytes)",
              "the checkpoint is corrupt: resume from an earlier one");
  set_cpu_rng_state(bytes.substr(head, n));
  const std::string dev = bytes.substr(head + n);
  if (!device.is_cuda() || dev.empty()) return;
  auto state = torch::empty({static_cast<int64_t>(dev.size())}, torch::kUInt8);
  std::memcpy(state.data_ptr(), dev.data(), dev.size());
  at::Generator gen = device_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

void set_strict_fp32(bool strict) {
  at::globalContext().setAllowTF32CuBLAS(!strict);
  at::globalContext().setAllowTF32CuDNN(!strict);
}

}  // namespace gpt2p::compat
