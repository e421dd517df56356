#include "gpt2p/compat/rng.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstring>

#include "gpt2p/compat/version.h"
#include "gpt2p/core/error.h"

namespace gpt2p::compat {

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
  if (bytes.size() < head ||
      bytes.compare(0, sizeof kRngMagic, std::string(kRngMagic, sizeof kRngMagic)) != 0) {
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

}  // namespace gpt2p::compat
