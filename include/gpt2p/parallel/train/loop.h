// The one training loop of every trainer. It owns what all kinds of training do the same way:
// epochs and steps, each step's timing record and the progress line, the epoch's end (HW5's
// per-rank line, evaluation, its record), checkpoints (every --save-every steps, at each epoch's
// end, on a stop signal), --max-steps, the profiler, and stopping on a signal. What differs
// between data parallelism and a pipeline -- how one optimizer step runs, how the model is
// evaluated and saved -- is a StepStrategy.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "gpt2p/io/run_record.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/train/context.h"
#include "gpt2p/parallel/train/data.h"
#include "gpt2p/parallel/train/loss_scaler.h"

namespace gpt2p::parallel {

// What the loop reports at an epoch's end.
struct EpochEval {
  double loss = 0, perplexity = 0;
  double bleu = 0;       // NaN where not measured
  bool stopped = false;  // a stop was agreed during evaluation, which ended early (NaN figures)
};

// Asked between evaluation batches by every rank in step: true once the ranks have agreed to
// stop (a stop signal); the evaluation then ends at once.
using StopCheck = std::function<bool()>;

class StepStrategy {
 public:
  virtual ~StepStrategy() = default;

  // Sets the models to training (true) or evaluation mode.
  virtual void set_training(bool training) = 0;

  // One optimizer step on the data's next batch. Fills rec's phase times, tokens, loss, lr and
  // flops (this rank's); the loop sets step, epoch, start and end. `more`: another step of this
  // epoch follows, so the strategy may take that step's batch from the data early. Returns the
  // model FLOPs of the whole step over all ranks (the progress line's MFU).
  virtual double step(io::StepRecord& rec, bool more) = 0;

  // The run stops before the next step: a batch taken early goes back to the data, so that the
  // data's position is again that of the next step.
  virtual void cancel_next() {}

  // Commits a checkpoint of the models and optimizers, with `state`, to `dir` (every rank calls).
  virtual void save(const std::string& dir, const model::TrainState& state) = 0;

  // Evaluates the models at the end of `epoch` (every rank calls; rank 0 prints what it found),
  // asking `stop` between batches and ending early when it says so.
  virtual EpochEval evaluate(int64_t epoch, const StopCheck& stop) = 0;

  // Before the run's record closes: attributes of how the steps ran (CUDA graph replays).
  virtual void record_attributes(io::RunRecorder& /*recorder*/) {}
};

// The run's fixed facts for the loop.
struct LoopSetup {
  const char* program = "";  // "dp_train", for messages
  int rank = 0, ranks = 1;
  // Step tokens x this = the tokens of all ranks (data-parallel replicas: ranks; a pipeline: 1).
  double tokens_factor = 1.0;
  // The strategy's loss scaling (its state goes into checkpoints and the progress line).
  const LossScaler* scaler = nullptr;
};

// What the loop uses of the run: its flags, its device, and the ranks it agrees with. A test
// gives it fake communicators (comm/fake_communicator.h).
struct LoopContext {
  const TrainConfig& cfg;
  torch::Device device;
  comm::Communicator& comm;     // the start barrier and the barriers after evaluation
  comm::Communicator& control;  // the agreement on a stop signal, after every step
  double peak_flops = 0;        // one GPU's, for the progress line's MFU (0: none)
};

// Trains from `state` (a fresh run's is zero) to --epochs or --max-steps, recording into
// `recorder`. Returns 0, or cli::kExitStopped after a stop signal (a checkpoint is committed).
int run_training(const LoopContext& ctx, TrainData& data, io::RunRecorder& recorder,
                 const model::TrainState& state, const LoopSetup& setup, StepStrategy& strategy);
// The same with `ctx`'s flags, device, communicator and control communicator.
int run_training(const RunContext& ctx, TrainData& data, io::RunRecorder& recorder,
                 const model::TrainState& state, const LoopSetup& setup, StepStrategy& strategy);

}  // namespace gpt2p::parallel
