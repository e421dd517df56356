// Hugging Face GPT-2 checkpoints: a directory with config.json and model.safetensors, as
// GPT2LMHeadModel.save_pretrained(dir, safe_serialization=True) writes (names "transformer.*"),
// or the hub's gpt2 files (names without the prefix). Name mapping is a table: our names are HF's
// without "transformer."; HF's Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
// are stored [in, out] and ours [out, in].
#pragma once

#include <string>

#include "gpt2p/model/gpt2.h"

namespace gpt2p::model {

// True when dir holds config.json and model.safetensors.
bool is_hf_dir(const std::string& dir);

// Our config from HF's config.json (n_layer, n_head, n_embd, n_positions, vocab_size,
// layer_norm_epsilon, resid_pdrop); `extra_vocab` tokens are added to HF's vocab_size.
GPT2Config read_hf_config(const std::string& dir, int64_t extra_vocab = 0);

// Copies the HF weights into `model` (a full model or a stage: only the parameters it holds).
// config.json is read first: it must be valid JSON with n_layer, n_head, n_embd, n_positions equal
// to the model's and vocab_size at most the model's (and wte's rows); an error names the field,
// both values and the fix.
// If the model's vocab is larger than HF's, the new rows get the mean of HF's embedding rows; the
// padded rows are zeroed. A present lm_head.weight must equal wte (GPT-2 ties them).
void import_hf(const std::string& dir, GPT2Impl& model);

// read_hf_config + a model of that config + import_hf.
GPT2 load_hf(const std::string& dir, int64_t extra_vocab = 0);

// Writes config.json (model_type gpt2, HF field names) and model.safetensors (transformer.*
// names, Conv1D layout, F32, vocab_size rows) to dir, atomically. Needs the full model.
void export_hf(const std::string& dir, const GPT2Impl& model);

}  // namespace gpt2p::model
