#include "gpt2p/cli/main_guard.h"

#include <mpi.h>

#include <cstdio>
#include <exception>

#include "gpt2p/cli/options.h"
#include "gpt2p/core/error.h"

namespace gpt2p::cli {
namespace {

[[noreturn]] void bring_down(const char* program, const std::string& message, int code) {
  std::fprintf(stderr, "%s: error: %s\n", program, message.c_str());
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int size = 1;
  if (initialized != 0 && finalized == 0) MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  if (initialized != 0 && finalized == 0) MPI_Finalize();
  std::exit(code);
}

}  // namespace

int run_guarded(const char* program, int argc, char** argv, const ProgramBody& body) {
  try {
    MpiEnv env(&argc, &argv);
    return body(env.topology(), argc, argv);
  } catch (const UsageError& e) {
    bring_down(program, e.what(), kExitUsage);
  } catch (const Error& e) {
    bring_down(program, e.what(), kExitError);
  } catch (const std::exception& e) {
    bring_down(program, "[" + process_label() + "] " + e.what(), kExitError);
  }
}

}  // namespace gpt2p::cli
