// pp_train's step, a StepStrategy for the one training loop (train/loop.h): the executor runs
// this rank's part of the schedule, each stage's reducer (reducer.h) sums its gradients over the
// stage's replicas, the tied weight's two stages sum their halves, the gradients are clipped over
// every stage and applied; the loss comes from the last stage. pp_trainer.cpp sets up what it is
// given and keeps what is passed by reference alive.
#pragma once

#include <memory>
#include <vector>

#include "gpt2p/io/run_record.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/data_parallel/reducer.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/loop.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/runtime/executor.h"
#include "gpt2p/pipeline/runtime/stage.h"

namespace gpt2p::parallel {

// `reducers`: one per stage of `models` (the step owns them). `my_stages` are this rank's global
// stage indices into `split`. `scaler`: the run's loss scaling (loss_scaler.h).
std::unique_ptr<StepStrategy> make_pipeline_step(
    const RunContext& ctx, TrainData& data, io::RunRecorder& recorder,
    std::vector<model::GPT2>& models, std::vector<std::unique_ptr<GradReducer>> reducers,
    std::vector<std::unique_ptr<pipeline::GptStage>>& stages, pipeline::Executor& executor,
    const std::vector<int>& my_stages, const pipeline::Partition& split, int microbatches,
    model::LossPositions positions, LossScaler& scaler);

}  // namespace gpt2p::parallel
