// Pipeline-parallel GPT-2 training: mpirun -np STAGES pp_train [options]; see --help.
#include "gpt2p/cli/main_guard.h"
#include "gpt2p/parallel/train/flags.h"
#include "gpt2p/parallel/train/options.h"
#include "gpt2p/parallel/trainers/pp_trainer.h"

int main(int argc, char** argv) {
  using namespace gpt2p;
  return cli::run_guarded("pp_train", argc, argv, [](const Topology& topo, int argc, char** argv) {
    parallel::TrainConfig cfg;
    bool train = true;  // false after --help
    // Every rank parses; a bad flag ends the job with one message and exit 2.
    cli::on_every_rank(
        [&] { train = parallel::parse_train_args(cfg, parallel::Program::kPipeline, argc, argv); });
    if (!train) return 0;
    return parallel::train_pipeline(cfg, topo);
  });
}
