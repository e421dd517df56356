#include "gpt2p/pipeline/plan/partition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "gpt2p/core/error.h"

namespace gpt2p::pipeline {
namespace {

void check_stage_count(int n_blocks, int n_stages, const char* where) {
  GPT2P_CHECK(n_blocks >= 1, where << ": n_blocks = " << n_blocks << " < 1",
              "the model needs at least one transformer block");
  GPT2P_CHECK(n_stages >= 1, where << ": n_stages = " << n_stages << " < 1",
              "run at least one pipeline stage (one rank)");
  GPT2P_CHECK(n_stages <= n_blocks,
              where << ": n_stages = " << n_stages
                    << " is more than the model's n_blocks = " << n_blocks << " transformer blocks",
              "run at most " << n_blocks
                             << " pipeline stages (ranks per pipeline), or use a "
                                "model with at least "
                             << n_stages << " blocks");
}

}  // namespace

Partition partition_uniform(int n_blocks, int n_stages) {
  check_stage_count(n_blocks, n_stages, "partition_uniform");
  const int per_stage = (n_blocks + n_stages - 1) / n_stages;
  // Block boundaries b_k = min(k * per_stage, L); stage k holds blocks [b_k, b_{k+1}), i.e.
  // layers [b_k + 1, b_{k+1} + 1), plus the embedding (stage 0) and the head (last stage).
  auto boundary = [&](int k) { return std::min(k * per_stage, n_blocks); };
  Partition partition(n_stages);
  for (int k = 0; k < n_stages; ++k) {
    partition[k].begin = k == 0 ? 0 : boundary(k) + 1;
    partition[k].end = k == n_stages - 1 ? n_blocks + 2 : boundary(k + 1) + 1;
    GPT2P_CHECK(partition[k].size() > 0,
                "partition_uniform: " << n_blocks << " blocks at ceil(" << n_blocks << "/"
                                      << n_stages << ") = " << per_stage
                                      << " per stage leave stage " << k << " of " << n_stages
                                      << " without any layer",
                "use a stage count that divides the " << n_blocks
                                                      << " blocks, fewer stages, or the "
                                                         "balanced partition");
  }
  return partition;
}

Partition partition_balanced(const std::vector<double>& layer_costs, int n_stages) {
  const int n_layers = static_cast<int>(layer_costs.size());
  GPT2P_CHECK(n_layers >= 3,
              "partition_balanced: " << n_layers << " layer costs given; expected L + 2 >= 3 "
                                     << "(embedding, L blocks, head)",
              "pass one cost per layer: layer_costs_flops() or measured per-layer times");
  check_stage_count(n_layers - 2, n_stages, "partition_balanced");
  std::vector<double> prefix(n_layers + 1, 0.0);
  for (int i = 0; i < n_layers; ++i) {
    GPT2P_CHECK(std::isfinite(layer_costs[i]) && layer_costs[i] >= 0.0,
                "partition_balanced: cost of layer " << i << " is " << layer_costs[i],
                "layer costs must be finite and >= 0");
    prefix[i + 1] = prefix[i] + layer_costs[i];
  }
  auto cost = [&](int begin, int end) { return prefix[end] - prefix[begin]; };

  // best[k][i]: the smallest possible largest stage cost when layers [0, i) go on k stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(n_stages + 1, std::vector<double>(n_layers + 1, inf));
  for (int i = 1; i <= n_layers; ++i) best[1][i] = cost(0, i);
  for (int k = 2; k <= n_stages; ++k) {
    for (int i = k; i <= n_layers; ++i) {
      for (int j = k - 1; j < i; ++j) {
        best[k][i] = std::min(best[k][i], std::max(best[k - 1][j], cost(j, i)));
      }
    }
  }
  const double bound = best[n_stages][n_layers];

  // From the last stage backwards, give each stage as many layers as the optimum allows while the
  // stages before it can still meet it.
  Partition partition(n_stages);
  int end = n_layers;
  for (int k = n_stages - 1; k >= 1; --k) {
    int begin = k;
    while (cost(begin, end) > bound || best[k][begin] > bound) ++begin;
    partition[k] = LayerRange{begin, end};
    end = begin;
  }
  partition[0] = LayerRange{0, end};
  return partition;
}

Partition partition_interleaved(const std::vector<double>& layer_costs, int n_ranks,
                                int stages_per_rank, long max_nodes) {
  GPT2P_CHECK(
      n_ranks >= 1 && stages_per_rank >= 1,
      "partition_interleaved: " << n_ranks << " rank(s) x " << stages_per_rank << " stage(s)",
      "pass at least one rank and one stage per rank");
  const int n_stages = n_ranks * stages_per_rank;
  Partition best = partition_balanced(layer_costs, n_stages);  // also checks the arguments
  if (stages_per_rank == 1) return best;
  const int n_layers = static_cast<int>(layer_costs.size());
  std::vector<double> prefix(n_layers + 1, 0.0);
  for (int i = 0; i < n_layers; ++i) prefix[i + 1] = prefix[i] + layer_costs[i];
  auto cost = [&](int begin, int end) { return prefix[end] - prefix[begin]; };
  const double eps = 1e-12 * std::max(prefix[n_layers], 1e-300);

  // (largest rank load, largest stage, sum of squared stage costs: the evener the stages, the
  // less each waits for its neighbour) of a split, compared with a tolerance for rounding.
  struct Key {
    double load, stage, squares;
  };
  const auto key_of = [&](const Partition& p) {
    std::vector<double> load(n_ranks, 0.0);
    Key k{0.0, 0.0, 0.0};
    for (int s = 0; s < n_stages; ++s) {
      const double c = cost(p[s].begin, p[s].end);
      load[s % n_ranks] += c;
      k.stage = std::max(k.stage, c);
      k.squares += c * c;
    }
    k.load = *std::max_element(load.begin(), load.end());
    return k;
  };
  const double eps2 = eps * std::max(prefix[n_layers], 1e-300);
  const auto better = [&](const Key& a, const Key& b) {
    if (a.load < b.load - eps) return true;
    if (a.load > b.load + eps) return false;
    if (a.stage < b.stage - eps) return true;
    if (a.stage > b.stage + eps) return false;
    return a.squares < b.squares - eps2;
  };
  Key best_key = key_of(best);
  std::vector<double> load(n_ranks, 0.0);
  std::vector<int> cuts(n_stages + 1, 0);
  cuts[n_stages] = n_layers;
  long nodes = 0;
  // Stage s starts at layer `begin`; `largest` is the largest stage before it, `squares` the sum
  // of the squared stage costs before it.
  std::function<void(int, int, double, double)> search = [&](int s, int begin, double largest,
                                                             double squares) {
    if (++nodes > max_nodes) return;
    const int r = s % n_ranks;
    if (s == n_stages - 1) {
      const double c = cost(begin, n_layers);
      load[r] += c;
      const Key key{*std::max_element(load.begin(), load.end()), std::max(largest, c),
                    squares + c * c};
      load[r] -= c;
      if (better(key, best_key)) {
        best_key = key;
        for (int k = 0; k < n_stages; ++k) best[k] = LayerRange{cuts[k], cuts[k + 1]};
      }
      return;
    }
    // Each later stage needs a layer; a longer stage only adds cost, so stop at the bound.
    for (int end = begin + 1; end <= n_layers - (n_stages - s - 1); ++end) {
      const double c = cost(begin, end);
      if (load[r] + c > best_key.load + eps) break;
      load[r] += c;
      cuts[s + 1] = end;
      search(s + 1, end, std::max(largest, c), squares + c * c);
      load[r] -= c;
    }
  };
  search(0, 0, 0.0, 0.0);
  return best;
}

std::vector<double> layer_costs_flops(int n_layer, int n_embd, int n_head, int seq_len,
                                      int vocab_size, double loss_fraction) {
  GPT2P_CHECK(n_layer >= 1 && n_embd >= 1 && n_head >= 1 && seq_len >= 1 && vocab_size >= 1,
              "layer_costs_flops: n_layer " << n_layer << ", n_embd " << n_embd << ", n_head "
                                            << n_head << ", seq_len " << seq_len << ", vocab_size "
                                            << vocab_size << ": all must be >= 1",
              "pass the model config (e.g. GPT-2 small: 12, 768, 12, 1024, 50257)");
  GPT2P_CHECK(n_embd % n_head == 0,
              "layer_costs_flops: n_embd " << n_embd << " is not a multiple of n_head " << n_head,
              "use an n_embd divisible by n_head");
  GPT2P_CHECK(loss_fraction > 0 && loss_fraction <= 1,
              "layer_costs_flops: loss fraction " << loss_fraction << " is not in (0, 1]",
              "pass the share of positions whose loss counts (1: every position)");
  const double t = seq_len;
  const double c = n_embd;
  const double v = vocab_size;
  const double block = 3.0 * (24.0 * t * c * c + 4.0 * t * t * c);
  const double head = 3.0 * (2.0 * t * c * v) * loss_fraction;
  std::vector<double> costs(n_layer + 2, block);
  costs.front() = 0.0;
  costs.back() = head;
  return costs;
}

std::vector<double> stage_costs(const std::vector<double>& layer_costs,
                                const Partition& partition) {
  const int n_layers = static_cast<int>(layer_costs.size());
  GPT2P_CHECK(!partition.empty(), "stage_costs: the partition has no stages",
              "pass a partition made for these layer costs (partition_uniform/balanced)");
  std::vector<double> out;
  int expect = 0;
  for (size_t s = 0; s < partition.size(); ++s) {
    const LayerRange& r = partition[s];
    GPT2P_CHECK(r.begin == expect && r.end > r.begin && r.end <= n_layers,
                "stage_costs: stage " << s << " holds [" << r.begin << ", " << r.end
                                      << ") but should start at layer " << expect
                                      << " and end after it, within " << n_layers << " layers",
                "pass a partition made for these layer costs (partition_uniform/balanced)");
    double sum = 0.0;
    for (int i = r.begin; i < r.end; ++i) sum += layer_costs[i];
    out.push_back(sum);
    expect = r.end;
  }
  GPT2P_CHECK(expect == n_layers,
              "stage_costs: the partition covers layers [0, " << expect << ") of " << n_layers,
              "pass a partition made for these layer costs (partition_uniform/balanced)");
  return out;
}

double max_stage_cost(const std::vector<double>& layer_costs, const Partition& partition) {
  const std::vector<double> costs = stage_costs(layer_costs, partition);
  return *std::max_element(costs.begin(), costs.end());
}

std::string to_string(const Partition& partition) {
  std::ostringstream os;
  for (size_t s = 0; s < partition.size(); ++s) {
    if (s > 0) os << "|";
    os << partition[s].begin << "-" << partition[s].end - 1;
  }
  return os.str();
}

}  // namespace gpt2p::pipeline
