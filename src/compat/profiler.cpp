#include "gpt2p/compat/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "gpt2p/compat/device.h"
#include "gpt2p/compat/version.h"
#include "gpt2p/core/error.h"

namespace gpt2p::compat {

namespace {
namespace prof = torch::profiler::impl;

std::set<prof::ActivityType> activities(const torch::Device& device) {
  std::set<prof::ActivityType> a{prof::ActivityType::CPU};
  if (device.is_cuda()) a.insert(prof::ActivityType::CUDA);
  return a;
}
}  // namespace

// Whether the library has Kineto is known only inside it (its USE_KINETO): ask by saving an
// empty profile.
bool Profiler::available() {
  static const bool has = [] {
    const auto path = std::filesystem::temp_directory_path() /
                      ("gpt2p-profiler-probe-" + std::to_string(::getpid()) + ".json");
    try {
      const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
      const std::set<prof::ActivityType> cpu{prof::ActivityType::CPU};
      torch::autograd::profiler::prepareProfiler(config, cpu);
      torch::autograd::profiler::enableProfiler(config, cpu);
      auto result = torch::autograd::profiler::disableProfiler();
      if (result) result->save(path.string());
    } catch (const std::exception&) {
      std::filesystem::remove(path);
      return false;
    }
    const bool saved = std::filesystem::exists(path);
    std::filesystem::remove(path);
    return saved;
  }();
  return has;
}

void Profiler::require_available() {
  GPT2P_CHECK(available(),
              "--profile: this libtorch (" << TORCH_VERSION << ") is built without Kineto, its "
                                           << "profiler",
              "profile on a PyTorch build of libtorch (the CUDA ones have it), or use Nsight "
              "Systems (nsys profile dp_train ...)");
}

Profiler::Profiler(const torch::Device& device) : device_(device) {}

Profiler::~Profiler() {
  if (!running_) return;
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {  // unwinding already; the profile is dropped
  }
}

void Profiler::start() {
  GPT2P_CHECK(!running_, "the profiler is already running", "stop() it before start()");
  require_available();
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities(device_));
  torch::autograd::profiler::enableProfiler(config, activities(device_));
  running_ = true;
}

void Profiler::stop(const std::string& path) {
  GPT2P_CHECK(running_, "the profiler is not running", "start() it first");
  synchronize(device_);
  running_ = false;
  auto result = torch::autograd::profiler::disableProfiler();
  GPT2P_CHECK(
      result != nullptr, "the profiler returned no result",
      "this libtorch may be built without Kineto (USE_KINETO); profile with Nsight instead");
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  result->save(path);
  GPT2P_CHECK(
      std::filesystem::exists(p) && std::filesystem::file_size(p) > 0,
      "the profiler wrote no trace to " << path,
      "this libtorch may be built without Kineto (USE_KINETO); profile with Nsight instead");
}

}  // namespace gpt2p::compat
