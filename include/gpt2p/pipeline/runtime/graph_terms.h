// Whether a run's steps can be captured as CUDA graphs (stage_graphs.h, parallel/train/
// graphed_step.h), asked in one place.
#pragma once

#include <string>

namespace gpt2p::pipeline {

// What decides whether a run's steps can be captured as CUDA graphs. pp_train and dp_train read
// these off their flags, pp_plan off the plan it times, so that all three give the same answer
// for the same run, in the same words.
struct GraphTerms {
  bool requested = true;       // --cuda-graphs auto (false: off)
  bool gpu = false;            // the device is a GPU (the build must also have CUDA)
  bool every_position = true;  // the head at every position: its row count never changes
  bool recompute = false;      // --recompute blocks
  // A pipeline stage's own terms (a data-parallel step's graph has none of these):
  bool zero_bubble = false;  // --zero-bubble
  int replicas = 1;          // data-parallel replicas of the pipeline (--dp)

  bool operator==(const GraphTerms& o) const {
    return requested == o.requested && gpu == o.gpu && every_position == o.every_position &&
           recompute == o.recompute && zero_bubble == o.zero_bubble && replicas == o.replicas;
  }
};

// Why such a run cannot be captured, or "" when nothing forbids it.
std::string graph_blocker(const GraphTerms& terms);

}  // namespace gpt2p::pipeline
