// pp_train's step, a StepStrategy for the one training loop (train/loop.h): the executor runs
// this rank's part of the schedule, each stage's reducer (reducer.h) sums its gradients over the
// stage's replicas, the tied weight's two stages sum their halves, the gradients are clipped over
// every stage and applied; the loss comes from the last stage. pp_trainer.cpp builds the stages'
// models; make_pipeline_step builds the rest and owns it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpt2p/compat/adamw.h"
#include "gpt2p/io/run_record.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/data_parallel/reducer.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/loop.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/runtime/executor.h"
#include "gpt2p/pipeline/runtime/graph_terms.h"
#include "gpt2p/pipeline/runtime/stage.h"

namespace gpt2p::parallel {

// This rank's stages before the step exists: the pipeline's layer split, the global indices of
// the stages this rank runs (rank, rank + P, ...) and their models with their AdamW (fresh, or
// holding a resumed checkpoint's state).
struct PipelineStages {
  pipeline::Partition split;
  std::vector<int> mine;
  std::vector<model::GPT2> models;
  std::vector<std::unique_ptr<compat::FusedAdamW>> optimizers;
};

// Builds this rank's pipeline step from the run and its stages, and owns what it builds: per
// stage a reducer over the stage's replicas (the mesh's dp: their sum, or --zero 1's shards) and
// a GptStage of M = cfg.pipeline.microbatches micro-batches; the schedule (--schedule,
// --zero-bubble, whose costs take `loss_share`, the head's share of positions); the transport over
// the mesh's pp channels; the executor of this rank's actions; and for the validation loss a
// GptEvalStage per stage with a forward-only executor (make_forward_only_schedule) over the same
// transport. `recorder` and `scaler` are the run's (the loop uses them too). Rank 0 prints ZeRO-1's
// state size.
// Why this run's stages cannot run their micro-batches as CUDA graphs (--cuda-graphs;
// pipeline/runtime/stage_graphs.h), or "" when they do.
std::string pipeline_graph_blocker(const RunContext& ctx);
// Its terms (pipeline/runtime/graph_terms.h) for a run of these flags on `device` with `replicas`
// data-parallel replicas (the mesh's dp): what pp_plan must read off the same run alike.
pipeline::GraphTerms pipeline_graph_terms(const TrainConfig& cfg, const torch::Device& device,
                                          int replicas);

std::unique_ptr<StepStrategy> make_pipeline_step(const RunContext& ctx, TrainData& data,
                                                 PipelineStages stages, double loss_share,
                                                 io::RunRecorder& recorder, LossScaler& scaler);

}  // namespace gpt2p::parallel
