// comm_bench: bandwidth of the Communicator's all_reduce and send/recv over a range of message
// sizes, in the spirit of nccl-tests' all_reduce_perf: `#` header lines, one fixed-width row per
// size with time, algorithm and bus bandwidth, and a correctness check next to the speed.
//
//   mpirun -np 2 comm_bench --backend mpi --max-bytes 64M
//
// Exit status 1 when any row is not correct.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpt2p/cli/config_agreement.h"
#include "gpt2p/cli/main_guard.h"
#include "gpt2p/cli/options.h"
#include "gpt2p/comm/communicator.h"
#include "gpt2p/comm/gpu_placement.h"
#include "gpt2p/compat/device.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/error.h"
#include "gpt2p/core/mpi_wait.h"

#ifdef GPT2P_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using gpt2p::cli::UsageError;
using gpt2p::comm::Communicator;

struct BenchConfig {
  gpt2p::comm::Backend backend = gpt2p::comm::Backend::kAuto;
  bool all_reduce = true;
  bool sendrecv = true;
  int64_t min_bytes = 1024;
  int64_t max_bytes = int64_t{512} << 20;
  int64_t step_factor = 2;
  int iters = 20;
  int warmup = 5;
  torch::ScalarType dtype = torch::kFloat32;
  bool json = false;
  std::string json_out;
};

struct Row {
  std::string op;
  int64_t bytes = 0;
  int64_t count = 0;
  double time_us = 0;
  double algbw = 0;  // GB/s
  double busbw = 0;  // GB/s
  bool correct = false;
};

// "1K", "512M", "1G", "4096": bytes, powers of 1024.
int64_t parse_bytes(const std::string& flag, const std::string& text) {
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string suffix = text.substr(used);
  int64_t scale = 0;
  if (suffix.empty() || suffix == "B") scale = 1;
  if (suffix == "K" || suffix == "k") scale = int64_t{1} << 10;
  if (suffix == "M" || suffix == "m") scale = int64_t{1} << 20;
  if (suffix == "G" || suffix == "g") scale = int64_t{1} << 30;
  if (used == 0 || scale == 0 || value <= 0) {
    throw UsageError("--" + flag + " '" + text +
                     "' is not a size: use a positive number of bytes " +
                     "with an optional suffix K, M or G (e.g. 1K, 512M)");
  }
  // No device holds a buffer of 1 TiB; the check also keeps value * scale from overflowing.
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  if (value > kMaxBytes / scale) {
    throw UsageError("--" + flag + " '" + text + "' is more than 1024G, the largest size tried: " +
                     "use a size up to 1024G (e.g. 512M)");
  }
  return value * scale;
}

BenchConfig parse_flags(int argc, char** argv, bool* run) {
  namespace po = gpt2p::cli::po;
  std::string op, min_bytes, max_bytes, dtype;
  BenchConfig c;
  po::options_description desc("comm_bench options");
  desc.add_options()(
      "backend", gpt2p::cli::named_value(c.backend, "backend"),
      "mpi | nccl | auto (auto: nccl when built with CUDA and a GPU is present, else mpi)")(
      "op", po::value(&op)->default_value("all"), "all_reduce | sendrecv | all")(
      "min-bytes", po::value(&min_bytes)->default_value("1K"),
      "smallest message, bytes (suffix K/M/G = 2^10/2^20/2^30)")(
      "max-bytes", po::value(&max_bytes)->default_value("512M"), "largest message, bytes (K/M/G)")(
      "step-factor", po::value(&c.step_factor)->default_value(2),
      "size multiplier between rows (>= 2)")("iters", po::value(&c.iters)->default_value(20),
                                             "timed iterations per size (>= 1)")(
      "warmup", po::value(&c.warmup)->default_value(5), "untimed iterations per size (>= 0)")(
      "dtype", po::value(&dtype)->default_value("float32"), "float32 | bfloat16")(
      "json", po::bool_switch(&c.json), "print one JSON document on stdout instead of the table")(
      "json-out", po::value(&c.json_out)->default_value(""),
      "also write the JSON document to this file (atomically); empty: none");
  po::variables_map vm;
  *run = gpt2p::cli::parse_or_help(
      "comm_bench", "Bandwidth of all_reduce and send/recv over message sizes (run under mpirun).",
      desc, argc, argv, vm);
  if (!*run) return c;
  if (c.backend == gpt2p::comm::Backend::kAuto) {
    c.backend = gpt2p::comm::nccl_available() && torch::cuda::is_available()
                    ? gpt2p::comm::Backend::kNccl
                    : gpt2p::comm::Backend::kMpi;
  }
  if (op != "all" && op != "all_reduce" && op != "sendrecv") {
    throw UsageError("--op '" + op + "': use all_reduce, sendrecv or all");
  }
  c.all_reduce = op != "sendrecv";
  c.sendrecv = op != "all_reduce";
  c.min_bytes = parse_bytes("min-bytes", min_bytes);
  c.max_bytes = parse_bytes("max-bytes", max_bytes);
  if (c.min_bytes > c.max_bytes) {
    throw UsageError("--min-bytes " + min_bytes + " is larger than --max-bytes " + max_bytes);
  }
  if (c.step_factor < 2) throw UsageError("--step-factor must be >= 2");
  if (c.iters < 1 || c.warmup < 0) throw UsageError("--iters must be >= 1 and --warmup >= 0");
  if (dtype == "float32") {
    c.dtype = torch::kFloat32;
  } else if (dtype == "bfloat16") {
    c.dtype = torch::kBFloat16;
  } else {
    throw UsageError("--dtype '" + dtype + "': use float32 or bfloat16");
  }
  return c;
}

// The parsed flags, keyed as the flags are named (check_same_config prints "min_bytes" as
// --min-bytes), with --backend auto resolved: what every rank must agree on before the first
// collective. "help" only where --help was given, so that a rank printing its usage and leaving
// is a difference too, not a peer waiting for it.
nlohmann::json to_json(const BenchConfig& c, bool run) {
  nlohmann::json j{{"backend", gpt2p::name_string(c.backend)},
                   {"op", c.all_reduce && c.sendrecv ? "all"
                          : c.all_reduce             ? "all_reduce"
                                                     : "sendrecv"},
                   {"min_bytes", c.min_bytes},
                   {"max_bytes", c.max_bytes},
                   {"step_factor", c.step_factor},
                   {"iters", c.iters},
                   {"warmup", c.warmup},
                   {"dtype", c.dtype == torch::kBFloat16 ? "bfloat16" : "float32"},
                   {"json", c.json},
                   {"json_out", c.json_out}};
  if (!run) j["help"] = true;
  return j;
}

void device_sync(const Communicator& comm) {
  if (comm.device().is_cuda()) torch::cuda::synchronize(comm.device().index());
}

// Rank r's input: (r + 1) + (i mod 3), small integers, exact in bfloat16 for modest world sizes.
torch::Tensor fill(int r, int64_t count, const BenchConfig& c, const torch::Device& device) {
  // int64 indices: a float32 arange stops being exact past 2^24 elements.
  auto i = torch::arange(count, torch::TensorOptions().dtype(torch::kInt64).device(device));
  return (i.remainder(3) + (r + 1)).to(c.dtype);
}

bool close_to(const torch::Tensor& got, const torch::Tensor& want, torch::ScalarType dtype) {
  const double rtol = dtype == torch::kBFloat16 ? 1e-2 : 1e-6;
  return torch::allclose(got.to(torch::kFloat64), want.to(torch::kFloat64), rtol, 0.0);
}

// Slowest rank's time; correct only if correct on every rank.
void agree(Row& row, double seconds, bool correct) {
  double worst = 0;
  int ok = correct ? 1 : 0;
  int all_ok = 0;
  GPT2P_MPI_CHECK(MPI_Allreduce(&seconds, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  GPT2P_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  row.time_us = worst * 1e6;
  row.algbw = worst > 0 ? static_cast<double>(row.bytes) / worst / 1e9 : 0;
  row.correct = all_ok == 1;
}

template <class F>
double timed(Communicator& comm, const BenchConfig& c, int repeats_per_iter, F&& step) {
  for (int i = 0; i < c.warmup; ++i) step();
  device_sync(comm);
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < c.iters; ++i) step();
  device_sync(comm);
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / (c.iters * repeats_per_iter);
}

Row bench_all_reduce(Communicator& comm, const BenchConfig& c, int64_t count) {
  const int n = comm.size();
  Row row{"all_reduce", count * static_cast<int64_t>(torch::elementSize(c.dtype)), count};
  torch::Tensor buf = fill(comm.rank(), count, c, comm.device());
  const double seconds = timed(comm, c, 1, [&] { comm.all_reduce(buf); });
  // Check after the timed loop, on fresh input (the loop keeps summing into buf).
  buf = fill(comm.rank(), count, c, comm.device());
  comm.all_reduce(buf);
  auto i = torch::arange(count, torch::TensorOptions().dtype(torch::kInt64).device(comm.device()));
  const torch::Tensor want = i.remainder(3).to(torch::kFloat64) * n + n * (n + 1) / 2.0;
  agree(row, seconds, close_to(buf, want, c.dtype));
  row.busbw = row.algbw * 2.0 * (n - 1) / n;
  return row;
}

// Ranks paired 0<->1, 2<->3, ...; with an odd world size the last rank idles. One iteration is a
// ping-pong; the time reported is per one-way transfer.
Row bench_sendrecv(Communicator& comm, const BenchConfig& c, int64_t count) {
  Row row{"sendrecv", count * static_cast<int64_t>(torch::elementSize(c.dtype)), count};
  const int rank = comm.rank();
  const int partner = rank ^ 1;
  const bool idle = partner >= comm.size();
  torch::Tensor out = fill(rank, count, c, comm.device());
  torch::Tensor in = torch::zeros_like(out);
  double seconds = 0;
  bool correct = true;
  if (!idle) {
    seconds = timed(comm, c, 2, [&] {
      if (rank % 2 == 0) {
        comm.send(out, partner);
        comm.recv(in, partner);
      } else {
        comm.recv(in, partner);
        comm.send(out, partner);
      }
    });
    correct = close_to(in, fill(partner, count, c, comm.device()), c.dtype);
  } else {
    comm.barrier();  // the pairs' barrier inside timed()
  }
  agree(row, seconds, correct);
  row.busbw = row.algbw;
  return row;
}

std::string gpu_name(const Communicator& comm) {
#ifdef GPT2P_WITH_CUDA
  if (comm.device().is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, comm.device().index()) == cudaSuccess) return prop.name;
  }
#endif
  (void)comm;
  return "";
}

std::string now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json header(const Communicator& comm, const BenchConfig& c, bool shared) {
  return {{"program", "comm_bench"},   {"backend", comm.backend_name()},
          {"world_size", comm.size()}, {"host", comm.topology().host},
          {"gpu", gpu_name(comm)},     {"dtype", gpt2p::comm::dtype_name(c.dtype)},
          {"date", now_iso()},         {"iters", c.iters},
          {"warmup", c.warmup},        {"ranks_share_gpu", shared}};
}

void print_header(const nlohmann::json& h) {
  std::printf("# comm_bench: %s\n", h["date"].get<std::string>().c_str());
  std::printf("# backend: %s, world size: %d, host: %s, gpu: %s\n",
              h["backend"].get<std::string>().c_str(), h["world_size"].get<int>(),
              h["host"].get<std::string>().c_str(),
              h["gpu"].get<std::string>().empty() ? "none" : h["gpu"].get<std::string>().c_str());
  if (h["ranks_share_gpu"].get<bool>()) {
    std::printf(
        "# ranks share a GPU: NCCL runs over sockets, MPI through host memory; these are "
        "functional figures, not the GPU's bandwidth\n");
  }
  std::printf("# dtype: %s, iters: %d, warmup: %d\n", h["dtype"].get<std::string>().c_str(),
              h["iters"].get<int>(), h["warmup"].get<int>());
  std::printf(
      "# time: slowest rank, per operation (sendrecv: per one-way transfer of a ping-pong)\n");
  std::printf("# busbw: all_reduce algbw*2*(n-1)/n, sendrecv algbw\n");
  std::printf("#%11s %13s %12s %12s %11s %11s %8s\n", "op", "bytes", "count", "time_us",
              "algbw_GBps", "busbw_GBps", "correct");
  std::fflush(stdout);
}

void print_row(const Row& r) {
  std::printf("%12s %13lld %12lld %12.2f %11.3f %11.3f %8s\n", r.op.c_str(),
              static_cast<long long>(r.bytes), static_cast<long long>(r.count), r.time_us, r.algbw,
              r.busbw, r.correct ? "yes" : "NO");
  std::fflush(stdout);
}

int run(const gpt2p::Topology& topo, const BenchConfig& c) {
  gpt2p::comm::CommOptions options;
  options.backend = c.backend;
  options.check_sizes = false;  // keep the host-side size check out of the timings
  bool shared = false;
  if (c.backend == gpt2p::comm::Backend::kNccl) {
    // Ranks may share a GPU (comm/gpu_placement.h).
    const auto gpus =
        gpt2p::comm::place_on_gpus(topo, static_cast<int>(torch::cuda::device_count()),
                                   gpt2p::compat::gpu_bus_id, gpt2p::kDefaultCommTimeout);
    gpt2p::comm::give_nccl_ranks_own_hosts(gpus, topo.rank);
    options.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpus.gpu));
    shared = gpus.job_shares;
  }
  auto comm = gpt2p::comm::make_communicator(options);
  const bool printer = topo.rank == 0;
  nlohmann::json doc = header(*comm, c, shared);
  doc["results"] = nlohmann::json::array();
  if (printer && !c.json) print_header(doc);
  const bool sendrecv = c.sendrecv && comm->size() >= 2;
  if (printer && !c.json && c.sendrecv && !sendrecv)
    std::printf("# sendrecv skipped: needs 2 ranks\n");
  const auto esize = static_cast<int64_t>(torch::elementSize(c.dtype));
  bool all_correct = true;
  // bytes <= 1 TiB (parse_bytes): the step stops before bytes * step_factor could overflow.
  for (int64_t bytes = c.min_bytes; bytes <= c.max_bytes;
       bytes = bytes > c.max_bytes / c.step_factor ? c.max_bytes + 1 : bytes * c.step_factor) {
    const int64_t count = bytes / esize;
    if (count == 0) continue;
    std::vector<Row> rows;
    if (c.all_reduce) rows.push_back(bench_all_reduce(*comm, c, count));
    if (sendrecv) rows.push_back(bench_sendrecv(*comm, c, count));
    for (const Row& r : rows) {
      all_correct = all_correct && r.correct;
      if (printer && !c.json) print_row(r);
      doc["results"].push_back({{"op", r.op},
                                {"bytes", r.bytes},
                                {"count", r.count},
                                {"time_us", r.time_us},
                                {"algbw_GBps", r.algbw},
                                {"busbw_GBps", r.busbw},
                                {"correct", r.correct}});
    }
  }
  doc["all_correct"] = all_correct;
  if (printer) {
    if (c.json) std::cout << doc.dump(2) << std::endl;
    if (!c.json_out.empty()) gpt2p::write_text_atomically(c.json_out, doc.dump(2) + "\n");
    if (!all_correct) std::fprintf(stderr, "comm_bench: some rows are NOT correct\n");
  }
  comm->barrier();
  return all_correct ? 0 : gpt2p::cli::kExitError;
}

}  // namespace

int main(int argc, char** argv) {
  return gpt2p::cli::run_guarded(
      "comm_bench", argc, argv, [](const gpt2p::Topology& topo, int argc, char** argv) {
        bool run_it = true;
        BenchConfig config;
        // Every rank parses; a bad flag on any rank ends the job with
        // one message and exit 2, as in the trainers.
        gpt2p::cli::on_every_rank([&] { config = parse_flags(argc, argv, &run_it); });
        // Ranks started with different flags (an MPMD launch) would
        // run collectives of different sizes and counts: a hang or an
        // MPI error. They agree first, or all exit 2 naming the flag.
        gpt2p::cli::check_same_config(to_json(config, run_it));
        return run_it ? run(topo, config) : 0;
      });
}
