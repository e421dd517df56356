// What pp_plan prints: the planner's predictions (planner.h) and the hybrid search's (hybrid.h)
// as fixed-width tables whose comment lines start with '#', each ending in the pp_train command
// line of the fastest plan, and the same predictions as one JSON document. Torch-free.
#pragma once

#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "gpt2p/model/config.h"

namespace gpt2p::pipeline {

struct PlanSpec;
struct Plan;
struct HybridPlan;

// make_plan's `plan` for `spec` on `config`, timed on `device` ("cpu" or the GPU's name): the
// request, the layer times per micro-batch size, the planner's notes, one row per prediction, a
// warning where a speed-up exceeds the stages' bound, and the fastest pipeline plan.
void print_plan(std::FILE* out, const Plan& plan, const PlanSpec& spec,
                const model::GPT2Config& config, const std::string& device);

// planner.h's to_json of `plan` with the request beside it ("program": "pp_plan", the model,
// stages, batch, precision, device, link bandwidth, loss fraction, recompute, zero).
nlohmann::json plan_document(const Plan& plan, const PlanSpec& spec,
                             const model::GPT2Config& config, const std::string& device);

// The line print_hybrid's table stands under, printed before the search (which takes minutes).
void print_hybrid_header(std::FILE* out, int gpus, const PlanSpec& spec);

// plan_hybrid's `hybrid` for the global `spec`: the skipped splits, one row per D x P split,
// fastest first, and the mpirun line of the fastest.
void print_hybrid(std::FILE* out, const HybridPlan& hybrid, const PlanSpec& spec);

// The request and every split's row ("hybrid": [{dp, pp, schedule, ..., tokens_per_s, ...}]).
nlohmann::json hybrid_document(const HybridPlan& hybrid, const PlanSpec& spec,
                               const model::GPT2Config& config);

}  // namespace gpt2p::pipeline
