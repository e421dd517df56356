#include "gpt2p/parallel/train/checkpoint_commit.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "gpt2p/cli/main_guard.h"
#include "gpt2p/compat/rng.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"

namespace gpt2p::parallel {
namespace {

constexpr const char* kSetFormat = "gpt2p-checkpoint-set";

// Every rank's bytes, in rank order (all of equal length, as generator states of one build are).
std::vector<std::string> gather_bytes(comm::Communicator& control, const std::string& mine) {
  const auto words = static_cast<int64_t>((mine.size() + 3) / 4);
  auto t = torch::zeros({words}, torch::kInt32);
  std::memcpy(t.data_ptr(), mine.data(), mine.size());
  const torch::Tensor all = control.all_gather(t).contiguous();
  std::vector<std::string> out;
  for (int r = 0; r < control.size(); ++r) {
    out.emplace_back(static_cast<const char*>(all[r].data_ptr()), mine.size());
  }
  return out;
}

}  // namespace

ResumePoint resume_point(int64_t epoch, int64_t next_batch, int64_t batches_per_epoch) {
  if (next_batch >= batches_per_epoch) return {epoch + 1, 0};
  return {epoch, next_batch};
}

void save_replicated_checkpoint(const RunContext& ctx, const std::string& root,
                                const model::GPT2Impl& model,
                                const torch::optim::Optimizer& optimizer, model::TrainState state) {
  state.rng_state = compat::rng_state(ctx.device);
  state.rank_rng_states = gather_bytes(*ctx.control, state.rng_state);
  cli::on_every_rank(
      [&] {
        if (ctx.topo.rank == 0) model::save_checkpoint(root, model, &optimizer, state);
      },
      ctx.checkpoint_timeout());
}

std::string rank_rng_state(const model::TrainState& state, int rank, int world) {
  if (state.rank_rng_states.size() == static_cast<size_t>(world)) {
    return state.rank_rng_states[static_cast<size_t>(rank)];
  }
  if (rank == 0 && world > 1) {
    std::fprintf(stderr,
                 "warning: the checkpoint holds generator states of %zu rank(s), this run has %d: "
                 "every rank continues from rank 0's, so dropout differs from an unbroken run\n",
                 state.rank_rng_states.size(), world);
  }
  return state.rank_rng_states.empty() ? state.rng_state : state.rank_rng_states.front();
}

void save_stage_checkpoints(const RunContext& ctx, const std::string& root,
                            const std::vector<StagePart>& mine, int n_stages,
                            model::TrainState state) {
  const std::string staging = root + ".next";
  const bool leader = ctx.topo.rank == 0;
  const auto timeout = ctx.checkpoint_timeout();
  state.rng_state = compat::rng_state(ctx.device);
  // With --dp D, replica 0 writes each stage, with the generator states of that stage's D ranks.
  const bool writer = ctx.mesh.dp_rank() == 0;
  if (ctx.mesh.dp() > 1) {
    const auto all = gather_bytes(*ctx.control, state.rng_state);
    state.rank_rng_states.clear();
    for (int d = 0; d < ctx.mesh.dp(); ++d) {
      const int r = ctx.mesh.world_rank_along(MeshDim::kDp, d);
      state.rank_rng_states.push_back(all[static_cast<size_t>(r)]);
    }
  }
  // 1. A clean staging directory (a run killed while saving may have left one).
  cli::on_every_rank(
      [&] {
        if (!leader) return;
        GPT2P_CHECK(
            remove_tree(staging),
            "cannot remove the unfinished checkpoint " << staging << ": " << std::strerror(errno),
            "remove it by hand, or check the permissions of --out");
      },
      timeout);
  // 2. Every rank its parts; 3. rank 0 commits once all are there.
  try {
    cli::on_every_rank(
        [&] {
          if (!writer) return;
          for (const auto& part : mine) {
            model::save_checkpoint(staging + "/stage" + std::to_string(part.stage), *part.model,
                                   part.optimizer, state);
          }
        },
        timeout);
    cli::on_every_rank(
        [&] {
          if (!leader) return;
          model::write_checkpoint_manifest(staging, {{"format", kSetFormat},
                                                     {"step", state.step},
                                                     {"epoch", state.epoch},
                                                     {"batch_in_epoch", state.batch_in_epoch},
                                                     {"stages", n_stages},
                                                     {"dp", ctx.mesh.dp()}});
          replace_dir(staging, root);
        },
        timeout);
  } catch (const cli::AgreedFailure&) {
    if (leader) remove_tree(staging);
    throw;
  }
}

namespace {

// A pipeline checkpoint written before stages were committed together has no manifest: it is
// taken when every stage is at one step.
void check_stages_without_manifest(const std::string& root, int n_stages) {
  std::string steps;
  bool same = true;
  int64_t first = -1;
  for (int s = 0; s < n_stages; ++s) {
    const std::string dir = root + "/stage" + std::to_string(s);
    if (!model::is_checkpoint_dir(dir)) return;  // checkpoint_partition names the missing stage
    const int64_t step = model::read_train_state(dir).step;
    if (s == 0) first = step;
    same = same && step == first;
    steps += (s == 0 ? "" : ", ") + std::string("stage ") + std::to_string(s) + ": " +
             std::to_string(step);
  }
  GPT2P_CHECK(same,
              "--resume " << root << " is not a committed checkpoint: it has no manifest.json and "
                          << "its stages are at different steps (" << steps << ")",
              "resume from a checkpoint that one run wrote whole");
}

}  // namespace

void check_stage_checkpoint(const std::string& root, int n_stages, int dp) {
  if (!std::filesystem::exists(root + "/manifest.json")) {
    check_stages_without_manifest(root, n_stages);
    return;
  }
  const auto manifest = model::read_checkpoint_manifest(root);
  const std::string path = root + "/manifest.json";
  const char* corrupt = "the checkpoint is corrupt: resume from an earlier copy";
  const auto field = [&](const char* key, int64_t lo, int64_t hi) {
    return io::json_int_field(manifest, key, lo, hi, path, corrupt);
  };
  const int64_t stages = field("stages", 1, 1 << 20);
  GPT2P_CHECK(stages == n_stages,
              "--resume " << root << " holds " << stages << " stages, this run has " << n_stages,
              "resume with the ranks and --stages-per-rank of the run that wrote it");
  // A replica's batches depend on D: the data position of another D is another batch.
  const int64_t written_dp = manifest.contains("dp") ? field("dp", 1, 1 << 20) : 1;
  GPT2P_CHECK(written_dp == dp,
              "--resume " << root << " was written with --dp " << written_dp
                          << ", this run has --dp " << dp,
              "resume with --dp " << written_dp << " (and its number of ranks)");
  const int64_t step = field("step", 0, std::numeric_limits<int64_t>::max());
  for (int s = 0; s < n_stages; ++s) {
    const std::string dir = root + "/stage" + std::to_string(s);
    const auto state = model::read_train_state(dir);
    GPT2P_CHECK(state.step == step,
                "--resume " << root << ": stage " << s << " is at step " << state.step
                            << " but the checkpoint was committed at step " << step,
                "the checkpoint was assembled from different saves: resume from one written by a "
                "single run");
  }
}

}  // namespace gpt2p::parallel
