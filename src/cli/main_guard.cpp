#include "gpt2p/cli/main_guard.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <thread>

#include "gpt2p/cli/options.h"
#include "gpt2p/core/error.h"

namespace gpt2p::cli {
namespace {

bool mpi_up() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

int world_size() {
  int size = 1;
  if (mpi_up()) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// The message of an exception, with this rank's label where the error has none of its own.
std::string describe(const std::exception& e, bool labelled) {
  if (labelled || world_size() == 1) return error_message(e.what());
  return "[" + process_label() + "] " + error_message(e.what());
}

// MPI_Abort ends every rank of the job, also those blocked in a collective. It asks the launcher
// (mpirun's daemon, Slurm's step daemon) to do so, and a rank cut off from the launcher by a
// network partition can wait in it for a minute or more: this rank ends itself 3 s later anyway,
// so that it never outlives its error by more.
void abort_job(int code) {
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::_Exit(code);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, code);
}

[[noreturn]] void bring_down(const char* program, const std::string& message, int code) {
  std::fprintf(stderr, "%s: error: %s\n", program, message.c_str());
  std::fflush(stderr);
  // Called while MPI is still initialised (see the header).
  if (world_size() > 1) abort_job(code);
  if (mpi_up()) MPI_Finalize();
  std::exit(code);
}

// The program's name for errors that end the job from another thread (core/error.h: fatal).
std::atomic<const char*> fatal_program{"gpt2p"};

// As bring_down, from a thread that is not main's: MPI_Abort (which Open MPI and MPICH take from
// any thread) but no MPI_Finalize or exit(), which would run atexit handlers and static
// destructors under a main thread that still runs.
[[noreturn]] void bring_down_from_any_thread(const Error& error) {
  std::fprintf(stderr, "%s: error: %s\n", fatal_program.load(), error.what());
  std::fflush(stderr);
  if (world_size() > 1) abort_job(kExitError);
  std::_Exit(kExitError);
}

}  // namespace

std::string error_message(const std::string& what) {
  std::string m = what;
  for (const char* tail : {"\nException raised from", "\nframe #"}) {
    const auto at = m.find(tail);
    if (at != std::string::npos) m.erase(at);
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  if (m.find("out of memory") != std::string::npos && m.find(" -- fix: ") == std::string::npos) {
    m += " -- fix: use less memory per rank: a smaller --batch-size or --seq-len, or in the "
         "trainers more --grad-accum steps or --microbatches, --recompute blocks, --zero 1 "
         "(data parallel), more pipeline stages; pp_plan predicts each rank's peak";
  }
  return m;
}

void on_every_rank(const std::function<void()>& check, std::chrono::milliseconds timeout) {
  int code = 0;
  std::string message;
  try {
    check();
  } catch (const AgreedFailure&) {
    throw;  // a nested agreement already ended the job on every rank
  } catch (const UsageError& e) {
    code = kExitUsage;
    message = describe(e, false);
  } catch (const Error& e) {
    code = kExitError;
    message = e.what();
  } catch (const std::exception& e) {
    code = kExitError;
    message = describe(e, false);
  }
  int rank = 0;
  GPT2P_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  // {largest code, -(lowest failing rank)} in one MAX reduction.
  int agreed[2] = {code, code != 0 ? -rank : -INT_MAX};
  allreduce_ints(agreed, 2, MPI_MAX, MPI_COMM_WORLD, timeout, "the ranks' start-up checks");
  if (agreed[0] != 0) throw AgreedFailure(agreed[0], message, -agreed[1] == rank);
}

int run_guarded(const char* program, int argc, char** argv, const ProgramBody& body) {
  // MPI lives outside the try: an error unwinds to the catch below with MPI still up, so the
  // failing rank can abort the job rather than wait in MPI_Finalize for ranks that wait for it.
  std::optional<MpiEnv> env;
  fatal_program.store(program);
  // A write to a socket whose peer died (its node went down) must fail with EPIPE, which MPI
  // reports with the peer's host, rather than end this rank without a word through SIGPIPE. A
  // closed stdout then fails the progress lines, and training goes on to its checkpoints.
  std::signal(SIGPIPE, SIG_IGN);
  set_fatal_handler(&bring_down_from_any_thread);
  try {
    env.emplace(&argc, &argv);
  } catch (const std::exception& e) {
    bring_down(program, e.what(), kExitError);
  }
  try {
    return body(env->topology(), argc, argv);
  } catch (const AgreedFailure& e) {
    if (e.reporter) {
      std::fprintf(stderr, "%s: error: %s\n", program, e.what());
      std::fflush(stderr);
    }
    env.reset();  // every rank is here: MPI_Finalize cannot wait for anyone
    return e.code;
  } catch (const UsageError& e) {
    bring_down(program, describe(e, false), kExitUsage);
  } catch (const Error& e) {
    bring_down(program, e.what(), kExitError);
  } catch (const std::exception& e) {
    bring_down(program, describe(e, false), kExitError);
  }
}

}  // namespace gpt2p::cli
