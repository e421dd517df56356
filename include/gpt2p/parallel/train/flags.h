// The command line of the three trainers: the flags of each TrainConfig section (train/options.h),
// one --help group a section. Only the programs include this; the mechanisms take the options.
#pragma once

#include <string>

#include "gpt2p/cli/options.h"
#include "gpt2p/parallel/train/options.h"

namespace gpt2p::parallel {

namespace po = cli::po;

// Declares every flag of `program` on `desc`, bound to fields of `cfg`. One table
// (cli/flag_table.h) declares them, here and for to_config_file.
void add_train_options(po::options_description& desc, TrainConfig& cfg, Program program);

// The resolved `cfg` as a config file that `program --config FILE` runs again: every flag of
// `program` with its value, in the order of --help, but --resume and --overwrite (how one start
// treats --out) and the model overrides and paths left at "the preset's" / "none".
std::string to_config_file(const TrainConfig& cfg, Program program);

// The file a run writes its resolved options to, in its --out.
inline constexpr const char* kRunConfigFile = "config.ini";

// Rank 0 of a run that starts training (a resume that passed its checks included) writes
// to_config_file(cfg, program) to <out>/config.ini, atomically: a start refused before that leaves
// the folder's file as it was.
void write_run_config(const TrainConfig& cfg, Program program);

// The config file of the run whose checkpoint directory is `checkpoint` (<out>/checkpoint ->
// <out>/config.ini), or "" when `checkpoint` holds no checkpoint or its run wrote no such file.
std::string run_config_of(const std::string& checkpoint);

// Refuses (UsageError) a --resume checkpoint of the other kind of trainer: a pipeline checkpoint
// (manifest.json) for dp_train or gpt2_train, a replicated one (meta.json) for pp_train, naming
// the program that continues it.
void check_resume_program(const std::string& checkpoint, Program program);

// Parses argv; returns false after --help. With --resume CHECKPOINT the settings of the run it
// continues (run_config_of) fill every flag that neither the command line nor --config gives: its
// --out, --epochs, ... (check_resume_identity then names or refuses a flag given otherwise).
bool parse_train_args(TrainConfig& cfg, Program program, int argc, char** argv);

}  // namespace gpt2p::parallel
