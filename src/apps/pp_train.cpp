// Pipeline-parallel GPT-2 training: mpirun -np STAGES pp_train [options]; see --help.
#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/train_options.h"
#include "gpt2p/parallel/pp_trainer.h"

int main(int argc, char** argv) {
  using namespace gpt2p;
  return cli::run_guarded("pp_train", argc, argv, [](const Topology& topo, int argc, char** argv) {
    cli::TrainConfig cfg;
    if (!cli::parse_train_args(cfg, cli::Program::kPipeline, argc, argv)) return 0;
    return parallel::train_pipeline(cfg, topo);
  });
}
