// main() for the MPI test binaries: every rank runs every test; the job fails if any rank fails.
// Only rank 0 prints gtest's progress; other ranks print only their failures.
#include <gtest/gtest.h>
#include <mpi.h>

#include "gpt2p/core/mpi_env.h"

namespace {

class QuietListener : public testing::EmptyTestEventListener {
 public:
  QuietListener(testing::TestEventListener* inner, int rank) : inner_(inner), rank_(rank) {}
  ~QuietListener() override { delete inner_; }
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed()) {
      fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
              r.line_number(), r.summary());
    }
  }

 private:
  testing::TestEventListener* inner_;
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  gpt2p::MpiEnv env(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  const int rank = env.topology().rank;
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    auto* printer = listeners.Release(listeners.default_result_printer());
    listeners.Append(new QuietListener(printer, rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed;
}
