// Which kind of training checkpoint a folder holds, told by its root file alone (torch-free, so
// that the trainers' flag parsing can ask before anything is loaded):
//   meta.json      kReplicated: one model, as dp_train and gpt2_train write it (a pipeline's stage
//                  folder is one too)
//   manifest.json  kPipeline: pp_train's root over its stage<s>/ folders
// Nothing is read: checkpoint.h's readers check the files when they load them.
#pragma once

#include <string>

namespace gpt2p::model {

enum class CheckpointKind { kNone, kReplicated, kPipeline };

// kReplicated when dir/meta.json is a regular file, else kPipeline when dir/manifest.json is,
// else kNone (an unreadable or missing dir included).
CheckpointKind checkpoint_kind(const std::string& dir);

}  // namespace gpt2p::model
