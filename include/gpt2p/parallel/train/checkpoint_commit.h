// A checkpoint of the whole job, committed as one unit: either every part of it is in place and
// valid, or the previous checkpoint is left as it was.
//
//  * Data parallel (replicated): every rank's generator state is gathered to rank 0, which writes
//    <root> (model, optimizer, meta.json with each rank's state) atomically: a temporary
//    directory renamed over the old one.
//  * Pipeline (one part per stage): every rank writes its stages into <root>.next/stage<s> (with
//    --dp D, the ranks of replica 0, each stage with the generator states of its D replicas); the
//    ranks agree that all parts are complete; rank 0 writes <root>.next/manifest.json (the
//    commit marker: step, epoch, batch, stage count) and renames <root>.next over <root>.
//    Resuming reads the manifest first, and every stage must be at its step (a checkpoint from
//    before manifests is taken when all its stages are at one step).
//
// A failure on any rank (disk full, parameters not finite, a read-only --out) ends the job through
// cli::on_every_rank: one message from the lowest failing rank, the old checkpoint kept, the
// partial one removed.
#pragma once

#include <string>
#include <vector>

#include "gpt2p/model/checkpoint.h"
#include "gpt2p/model/gpt2.h"
#include "gpt2p/parallel/train/context.h"

namespace gpt2p::parallel {

// Where a resume continues when a checkpoint is taken after batch `batch` (0-based, finished)
// of `epoch`: the next batch, or the start of the next epoch after the epoch's last batch.
struct ResumePoint {
  int64_t epoch = 0;
  int64_t batch = 0;
};
ResumePoint resume_point(int64_t epoch, int64_t next_batch, int64_t batches_per_epoch);

// Data parallel: collective over ctx.control. `state` needs step/epoch/batch/seed/config; the
// generator states are filled in here.
void save_replicated_checkpoint(const RunContext& ctx, const std::string& root,
                                const model::GPT2Impl& model,
                                const torch::optim::Optimizer& optimizer, model::TrainState state);

// This rank's generator state from a replicated checkpoint's state (its own when the checkpoint
// has one per rank of this world size, else rank 0's with a warning printed by rank 0).
std::string rank_rng_state(const model::TrainState& state, int rank, int world);

// One stage of this rank: its global index, model and optimizer.
struct StagePart {
  int stage;
  const model::GPT2Impl* model;
  const torch::optim::Optimizer* optimizer;
};

// Pipeline: collective over ctx.control; `n_stages` parts in all, `mine` those of this rank.
void save_stage_checkpoints(const RunContext& ctx, const std::string& root,
                            const std::vector<StagePart>& mine, int n_stages,
                            model::TrainState state);

// Checks that <root> is a committed pipeline checkpoint of `n_stages` stages written with --dp
// `dp` (1 when the manifest does not say), each at the manifest's step; throws naming what is
// wrong and the fix.
void check_stage_checkpoint(const std::string& root, int n_stages, int dp = 1);

}  // namespace gpt2p::parallel
