#include "gpt2p/pipeline/runtime/graph_terms.h"

#include "gpt2p/compat/cuda_graph.h"

namespace gpt2p::pipeline {

std::string graph_blocker(const GraphTerms& terms) {
  if (!terms.requested) return "--cuda-graphs off";
  if (!terms.gpu || !compat::cuda_graphs_built()) return "the device is not a GPU";
  if (!terms.every_position) {
    return "the head runs at the target positions only (pp_train --loss-positions targets, "
           "pp_plan --loss-fraction below 1), whose count changes with every batch; the head at "
           "every position keeps it fixed";
  }
  if (terms.recompute) return "--recompute blocks reads the dropout state on the host";
  if (terms.zero_bubble) return "--zero-bubble defers weight gradients outside backward";
  if (terms.replicas > 1) {
    return "the replicas' gradient sum (pp_train --dp above 1) starts inside backward";
  }
  return "";
}

}  // namespace gpt2p::pipeline
