#include "gpt2p/core/error.h"

#include <mpi.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "gpt2p/core/process_info.h"

namespace gpt2p {
namespace {

std::string format(const std::string& what, const std::string& hint, const char* file, int line) {
  std::ostringstream os;
  os << "[" << process_label() << "] " << file << ":" << line << ": " << what;
  if (!hint.empty()) os << " -- fix: " << hint;
  return os.str();
}

}  // namespace

Error::Error(std::string what, std::string hint, const char* file, int line)
    : std::runtime_error(format(what, hint, file, line)),
      what_(std::move(what)),
      hint_(std::move(hint)) {}

std::string process_label() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  std::string rank = "?";
  if (initialized != 0 && finalized == 0) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    rank = std::to_string(r);
  }
  return "rank " + rank + " on " + host_name();
}

namespace {
std::atomic<FatalHandler> fatal_handler{nullptr};
}  // namespace

void set_fatal_handler(FatalHandler handler) { fatal_handler.store(handler); }

void fatal(const Error& error) {
  if (FatalHandler handler = fatal_handler.load(); handler != nullptr) handler(error);
  std::fprintf(stderr, "error: %s\n", error.what());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized != 0 && finalized == 0) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

namespace detail {

void throw_error(const std::string& what, const std::string& hint, const char* file, int line) {
  throw Error(what, hint, file, line);
}

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int len = 0;
  if (MPI_Error_string(code, text.data(), &len) != MPI_SUCCESS) len = 0;
  throw Error(std::string("MPI call failed: ") + call + ": " + std::string(text.data(), len),
              "check that every rank makes the same collective calls with matching sizes; "
              "rerun with --mca mpi_show_mca_params all for MPI's settings",
              file, line);
}

}  // namespace detail
}  // namespace gpt2p
