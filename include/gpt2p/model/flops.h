// How much arithmetic a training step is, and how much the GPU could do: the one place that
// defines the MFU the trainers print and record (torch-free).
//
// The count is llm.c's (and PaLM's): per token, 6 FLOPs per parameter (2 in the forward, 4 in
// the backward), plus attention's 6 * n_embd * T per block (QK^T and AV, half of them masked by
// causality). The tied head's parameters count once, as the head, and only for the positions the
// head is computed at (--loss-positions targets computes it for fewer). For GPT-2 124M at T=1024
// with the head everywhere: 6 * 124.5M + 6 * 12 * 768 * 1024 = 803.6 MFLOP per token.
// Recompute and the work of dropout or the optimizer do not count: MFU measures useful work.
#pragma once

#include <cstdint>
#include <string>

#include "gpt2p/model/config.h"
#include "gpt2p/model/options.h"

namespace gpt2p::model {

// The model FLOPs of training stage layers [begin, end) (0 = embedding, 1..n_layer = blocks,
// n_layer + 1 = final norm and head; gpt2.h) on `tokens` tokens of sequences of seq_len, with the
// head computed for `head_rows` of them.
double training_flops(const GPT2Config& config, int64_t begin, int64_t end, int64_t tokens,
                      int64_t seq_len, int64_t head_rows);

// Dense peak FLOP/s of one GPU for the precision the trainers run (kBf16, kFp16: half-precision
// tensor cores; kTf32; kFp32: plain float32 FMA), from the vendor's data sheet (H100/H200 and
// A100 SXM and PCIe/NVL, V100 SXM2 and PCIe); 0 when the
// GPU is not in the table (MFU is then not reported). GPT2P_PEAK_TFLOPS in the environment
// overrides the table (TFLOP/s).
double peak_flops(const std::string& gpu_name, Precision precision);

}  // namespace gpt2p::model
