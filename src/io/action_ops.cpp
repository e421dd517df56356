#include "gpt2p/io/action_ops.h"

#include <nlohmann/json.hpp>

namespace gpt2p::io {

namespace {
constexpr ActionOp kAll[] = {
    ActionOp::kForward,  ActionOp::kBackward, ActionOp::kSendActivation, ActionOp::kRecvActivation,
    ActionOp::kSendGrad, ActionOp::kRecvGrad, ActionOp::kOptimizer,      ActionOp::kWeight};
}  // namespace

const char* to_string(ActionOp op) {
  switch (op) {
    case ActionOp::kForward: return "forward";
    case ActionOp::kBackward: return "backward";
    case ActionOp::kSendActivation: return "send activation";
    case ActionOp::kRecvActivation: return "recv activation";
    case ActionOp::kSendGrad: return "send grad";
    case ActionOp::kRecvGrad: return "recv grad";
    case ActionOp::kOptimizer: return "optimizer";
    case ActionOp::kWeight: return "weight grad";
  }
  return "unknown";
}

std::string action_ops_json() {
  nlohmann::json table = nlohmann::json::object();
  for (const auto op : kAll) table[std::to_string(static_cast<int>(op))] = to_string(op);
  return table.dump();
}

}  // namespace gpt2p::io
