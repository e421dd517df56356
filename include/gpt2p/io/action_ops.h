// The op codes of the /actions table of every pipeline rank's timing file (run_record.h): one
// enum, one name per code. Each rank file also carries the table as its "action_ops" attribute
// (JSON: code -> name), which is what analysis/ reads, so the two can never disagree.
#pragma once

#include <string>

namespace gpt2p::io {

enum class ActionOp : int {
  kForward = 0,
  kBackward = 1,  // with a split backward (zero bubble): the input gradient only
  kSendActivation = 2,
  kRecvActivation = 3,
  kSendGrad = 4,
  kRecvGrad = 5,
  kOptimizer = 6,
  kWeight = 7,  // the weight-gradient half of a split backward
};

// "forward", "backward", "send activation", "recv activation", "send grad", "recv grad",
// "optimizer", "weight grad".
const char* to_string(ActionOp op);

// {"0": "forward", ...}: every code with its name, as JSON text.
std::string action_ops_json();

}  // namespace gpt2p::io
