// The command line of the three trainers: the flags of each TrainConfig section (train/options.h),
// one --help group a section. Only the programs include this; the mechanisms take the options.
#pragma once

#include "gpt2p/cli/options.h"
#include "gpt2p/parallel/train/options.h"

namespace gpt2p::parallel {

namespace po = cli::po;

// Declares every flag of `program` on `desc`, bound to fields of `cfg`.
void add_train_options(po::options_description& desc, TrainConfig& cfg, Program program);

// Parses argv; returns false after --help.
bool parse_train_args(TrainConfig& cfg, Program program, int argc, char** argv);

}  // namespace gpt2p::parallel
