// Single-rank GPT-2 training (CPU or one GPU): gpt2_train [options]; see --help.
#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/train_options.h"
#include "gpt2p/parallel/trainer.h"

int main(int argc, char** argv) {
  using namespace gpt2p;
  return cli::run_guarded("gpt2_train", argc, argv, [](const Topology& topo, int argc, char** argv) {
    cli::TrainConfig cfg;
    if (!cli::parse_train_args(cfg, cli::Program::kSingle, argc, argv)) return 0;
    return parallel::train_data_parallel(cfg, cli::Program::kSingle, topo);
  });
}
