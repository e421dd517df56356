// One family of checks for plain conditions, MPI, NCCL and CUDA.
//
// Every failed check throws gpt2p::Error whose message names the rank, host, file:line, what went
// wrong (with the library's own message) and what to do about it. Programs catch it in main
// (cli/main_guard.h) and call MPI_Abort, so one failing rank brings the whole job down.
//
//   GPT2P_CHECK(n % world == 0, "batch " << n << " does not divide over " << world << " ranks",
//               "pass --batch-size as a multiple of the number of ranks");
//   GPT2P_MPI_CHECK(MPI_Bcast(...));
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gpt2p {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string hint, const char* file, int line);

  const std::string& what_happened() const { return what_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string what_;
  std::string hint_;
};

// "rank R/host" of this process, or "rank ?" before MPI is up; used as the prefix of messages.
std::string process_label();

// Ends the job from a thread that cannot throw to the program's main (the NCCL watchdog,
// comm/nccl_communicator.cpp): the handler that the program's main guard installs
// (cli/main_guard.h) prints `error` as it prints every error and brings every rank down; without
// one, the message goes to stderr and MPI_Abort ends the job. Never returns.
using FatalHandler = void (*)(const Error& error);
void set_fatal_handler(FatalHandler handler);
[[noreturn]] void fatal(const Error& error);

namespace detail {
[[noreturn]] void throw_error(const std::string& what, const std::string& hint, const char* file,
                              int line);
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace gpt2p

// GPT2P_CHECK(cond, what, hint): `what` and `hint` are stream expressions.
#define GPT2P_CHECK(cond, what, hint)                                                         \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::ostringstream gpt2p_what_, gpt2p_hint_;                                            \
      gpt2p_what_ << what; /* NOLINT(bugprone-macro-parentheses) */                           \
      gpt2p_hint_ << hint; /* NOLINT(bugprone-macro-parentheses) */                           \
      ::gpt2p::detail::throw_error(gpt2p_what_.str(), gpt2p_hint_.str(), __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)

// GPT2P_FAIL(what, hint): unconditional.
#define GPT2P_FAIL(what, hint) GPT2P_CHECK(false, what, hint)

// GPT2P_MPI_CHECK(call): MPI calls return MPI_SUCCESS or an error code turned into text.
#define GPT2P_MPI_CHECK(call)                                                 \
  do {                                                                        \
    const int gpt2p_rc_ = (call);                                             \
    if (gpt2p_rc_ != 0) {                                                     \
      ::gpt2p::detail::throw_mpi_error(gpt2p_rc_, #call, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)
