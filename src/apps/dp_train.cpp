// Data-parallel GPT-2 training: mpirun -np N dp_train [options]; see --help.
#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/train_options.h"
#include "gpt2p/parallel/trainer.h"

int main(int argc, char** argv) {
  using namespace gpt2p;
  return cli::run_guarded("dp_train", argc, argv, [](const Topology& topo, int argc, char** argv) {
    cli::TrainConfig cfg;
    if (!cli::parse_train_args(cfg, cli::Program::kDataParallel, argc, argv)) return 0;
    return parallel::train_data_parallel(cfg, cli::Program::kDataParallel, topo);
  });
}
