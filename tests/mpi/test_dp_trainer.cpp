// The data-parallel trainer end to end at 2, 3 and 4 ranks: train_data_parallel on a small dataset
// file (tokenized with the real GPT-2 tokenizer) writes rank<r>.h5 with the HW5 metrics, saves a
// checkpoint, and a --resume from it continues at the right step exactly as an uninterrupted run.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "gpt2p/cli/train_options.h"
#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/model/checkpoint.h"
#include "gpt2p/parallel/trainer.h"
#include "support/h5_read.h"

namespace gpt2p::parallel {
namespace {

namespace fs = std::filesystem;

std::string vocab_dir() {
  if (const char* env = std::getenv("GPT2P_VOCAB_DIR"); env != nullptr && *env != '\0') return env;
  const char* data = std::getenv("GPT2P_TEST_DATA");
  const fs::path repo = data != nullptr ? fs::path(data) / ".." / ".." : fs::current_path();
  return (repo / ".cache" / "gpt2-vocab").string();
}

using gpt2p::testing::read_column;

// 64 short German/English pairs tokenized with the real tokenizer (train, validation and test).
void write_small_dataset(const std::string& path, const std::string& vocab) {
  auto tok = data::BpeTokenizer::from_dir(vocab);
  const auto special = data::register_special_tokens(tok);
  const char* de[] = {"das Haus",  "der Hund",  "die Katze", "ein Baum",
                      "der Fluss", "die Stadt", "ein Buch",  "das Kind"};
  const char* en[] = {"the house", "the dog",  "the cat", "a tree",
                      "the river", "the city", "a book",  "the child"};
  const char* adj_de[] = {"ist gross", "ist klein", "ist alt",  "ist neu",
                          "ist rot",   "ist hier",  "ist dort", "ist gut"};
  const char* adj_en[] = {"is big", "is small", "is old",   "is new",
                          "is red", "is here",  "is there", "is good"};
  data::Split train;
  data::Split other;
  for (int i = 0; i < 64; ++i) {
    const std::string d = std::string(de[i % 8]) + " " + adj_de[(i / 8 + i) % 8] + ".";
    const std::string e = std::string(en[i % 8]) + " " + adj_en[(i / 8 + i) % 8] + ".";
    train.add(tok.encode(d), tok.encode(e), d, e);
    if (i < 8) other.add(tok.encode(d), tok.encode(e), d, e);
  }
  data::DatasetMeta meta;
  meta.tokenizer_identity = tok.identity();
  meta.vocab_size = tok.vocab_size();
  meta.special = special;
  meta.source = "test_dp";
  data::write_dataset_file(path, meta, {{"train", train}, {"validation", other}, {"test", other}});
}

class DataParallelTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(vocab_dir()) / "encoder.json")) {
      GTEST_SKIP() << "no GPT-2 vocabulary at " << vocab_dir() << " (set GPT2P_VOCAB_DIR)";
    }
    // One directory for the job: rank 0's pid names it.
    auto pid = torch::tensor({static_cast<int64_t>(::getpid())});
    comm->broadcast(pid, 0);
    dir =
        (fs::temp_directory_path() / ("gpt2p_dp_" + std::to_string(pid.item<int64_t>()))).string();
    if (comm->rank() == 0) {
      remove_tree(dir);
      fs::create_directories(dir);
      write_small_dataset(dir + "/data.h5", vocab_dir());
    }
    comm->barrier();
  }
  void TearDown() override {
    comm->barrier();
    if (comm->rank() == 0 && !dir.empty()) remove_tree(dir);
  }

  cli::TrainConfig config(const std::string& out, int64_t max_steps) const {
    cli::TrainConfig c;
    c.preset = "tiny";
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_head = 2;
    c.dropout = 0;
    c.data = dir + "/data.h5";
    c.vocab_dir = vocab_dir();
    c.max_train_pairs = 0;
    c.max_eval_pairs = 8;
    c.epochs = 1;
    c.max_steps = max_steps;
    c.batch_size = 12;
    c.seq_len = 16;
    c.device = "cpu";
    c.out = dir + "/" + out;
    c.save_every = 2;
    c.translate_samples = 1;
    c.log_every = 1;
    c.grad_sync = "bucketed";
    c.bucket_mb = 0.05;
    return c;
  }
  std::string rank_file(const std::string& out) const {
    return dir + "/" + out + "/rank" + std::to_string(comm->rank()) + ".h5";
  }

  std::unique_ptr<comm::Communicator> comm = comm::make_mpi_communicator();
  Topology topo = query_topology(MPI_COMM_WORLD);
  std::string dir;
};

TEST_F(DataParallelTrainer, WritesRankFilesAndResumesAtTheRightStep) {
  ASSERT_EQ(train_data_parallel(config("a", 2), cli::Program::kDataParallel, topo), 0);
  const auto a = rank_file("a");
  ASSERT_TRUE(fs::exists(a)) << a;
  EXPECT_EQ(read_column(a, "/steps/step"), (std::vector<double>{0, 1}));
  const double local_rows = 12.0 / comm->size();
  for (const char* col : {"forward", "backward", "sync_total", "target_tokens", "loss"}) {
    for (double v : read_column(a, std::string("/steps/") + col)) EXPECT_GT(v, 0) << col;
  }
  for (double v : read_column(a, "/steps/padded_tokens")) EXPECT_EQ(v, local_rows * 16);
  const auto start = read_column(a, "/steps/start");
  const auto end = read_column(a, "/steps/end");
  for (size_t i = 0; i < start.size(); ++i) EXPECT_GT(end[i], start[i]);
  for (const char* col : {"train_time", "tokens_per_sec", "target_tokens_per_sec", "val_loss"}) {
    const auto v = read_column(a, std::string("/epochs/") + col);
    ASSERT_EQ(v.size(), 1U) << col;
    EXPECT_GT(v[0], 0) << col;
  }
  EXPECT_GT(read_column(a, "/epochs/val_ppl")[0], 1);
  const auto state = model::read_train_state(dir + "/a/checkpoint");
  EXPECT_EQ(state.step, 2);
  EXPECT_EQ(state.epoch, 0);
  EXPECT_EQ(state.batch_in_epoch, 2);

  // Resuming from step 2 runs step 2 exactly as a run that never stopped.
  auto resumed = config("b", 3);
  resumed.resume = dir + "/a/checkpoint";
  ASSERT_EQ(train_data_parallel(resumed, cli::Program::kDataParallel, topo), 0);
  ASSERT_EQ(train_data_parallel(config("c", 3), cli::Program::kDataParallel, topo), 0);
  EXPECT_EQ(read_column(rank_file("b"), "/steps/step"), (std::vector<double>{2}));
  EXPECT_EQ(read_column(rank_file("b"), "/steps/epoch"), (std::vector<double>{0}));
  const auto full = read_column(rank_file("c"), "/steps/loss");
  ASSERT_EQ(full.size(), 3U);
  const auto head = read_column(a, "/steps/loss");
  EXPECT_NEAR(head[0], full[0], 1e-6 * full[0]);
  EXPECT_NEAR(head[1], full[1], 1e-6 * full[1]);
  EXPECT_NEAR(read_column(rank_file("b"), "/steps/loss")[0], full[2], 1e-6 * full[2])
      << "the resumed step must see the same batch and parameters as the uninterrupted run";
  EXPECT_NE(full[2], full[1]);
}

}  // namespace
}  // namespace gpt2p::parallel
