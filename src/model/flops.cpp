#include "gpt2p/model/flops.h"

#include <algorithm>
#include <cstdlib>

namespace gpt2p::model {

double training_flops(const GPT2Config& c, int64_t begin, int64_t end, int64_t tokens,
                      int64_t seq_len, int64_t head_rows) {
  const int64_t head_layer = c.num_stage_layers() - 1;
  double flops = 0;
  for (int64_t layer = std::max<int64_t>(begin, 0); layer < std::min(end, head_layer + 1);
       ++layer) {
    if (layer == head_layer) {
      const double head_params = static_cast<double>(c.padded_vocab_size() * c.n_embd);
      const double norm_params = static_cast<double>(c.layer_parameters(layer));
      flops += 6.0 * (head_params * static_cast<double>(head_rows) +
                      norm_params * static_cast<double>(tokens));
    } else if (layer == 0) {  // the table is counted as the head; the positions' table here
      flops += 6.0 * static_cast<double>(c.n_ctx * c.n_embd) * static_cast<double>(tokens);
    } else {
      flops += (6.0 * static_cast<double>(c.layer_parameters(layer)) +
                6.0 * static_cast<double>(c.n_embd * seq_len)) *
               static_cast<double>(tokens);
    }
  }
  return flops;
}

double peak_flops(const std::string& gpu_name, Precision precision) {
  if (const char* env = std::getenv("GPT2P_PEAK_TFLOPS"); env != nullptr && *env != '\0') {
    return std::atof(env) * 1e12;
  }
  struct Peak {
    const char* name;
    double half, tf32, fp32;  // TFLOP/s, dense; half: bf16 and fp16 tensor cores
  };
  // The first name the GPU's contains wins: the PCIe and NVL parts before the SXM ones (H100 and
  // H200 SXM share the compute die and clocks); A100 SXM and PCIe share their peaks.
  static constexpr Peak kPeaks[] = {
      {"H100 PCIe", 756.0, 378.0, 51.2},
      {"H100 NVL", 835.0, 417.5, 59.8},
      {"H200 NVL", 835.0, 417.5, 59.8},
      {"H200", 989.4, 494.7, 66.9},
      {"H100", 989.4, 494.7, 66.9},
      {"A100", 312.0, 156.0, 19.5},
      // No TF32 (its float32 matmuls run as float32) and no bf16 (refused: check_precision).
      {"V100-PCIE", 112.0, 14.0, 14.0},
      {"V100", 125.0, 15.7, 15.7},
  };
  for (const auto& p : kPeaks) {
    if (gpu_name.find(p.name) == std::string::npos) continue;
    const bool half = precision == Precision::kBf16 || precision == Precision::kFp16;
    const double t = half ? p.half : precision == Precision::kTf32 ? p.tf32 : p.fp32;
    return t * 1e12;
  }
  return 0;
}

}  // namespace gpt2p::model
