// Random generators and their saved states (checkpoints) on every libtorch the project builds
// against (compat/version.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace gpt2p::compat {

// A CPU generator seeded with `seed`, independent of torch's global one (deterministic init).
at::Generator make_cpu_generator(uint64_t seed);

// Bytes of torch's default CPU generator state, and restoring them (checkpoints).
std::string cpu_rng_state();
void set_cpu_rng_state(const std::string& bytes);

// This process's generator states for a run on `device`: the CPU generator and, on a GPU, that
// GPU's (dropout there draws from it), as one byte string; restoring accepts it or a bare
// cpu_rng_state() (older checkpoints).
std::string rng_state(const torch::Device& device);
void set_rng_state(const torch::Device& device, const std::string& bytes);

}  // namespace gpt2p::compat
