// What the end-to-end trainer tests (dp_train's and pp_train's loops under MPI) share: a small
// dataset file tokenized with the real GPT-2 tokenizer, one temporary directory for the whole job,
// and a tiny CPU configuration that trains in about a second.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "gpt2p/comm/communicator.h"
#include "gpt2p/core/atomic_file.h"
#include "gpt2p/core/mpi_env.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/special_tokens.h"
#include "gpt2p/parallel/train/options.h"
#include "support/h5_read.h"

namespace gpt2p::testing {

// $GPT2P_VOCAB_DIR, else <repo>/.cache/gpt2-vocab (found from $GPT2P_TEST_DATA =
// <repo>/tests/data).
inline std::string vocab_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("GPT2P_VOCAB_DIR"); env != nullptr && *env != '\0') return env;
  const char* data = std::getenv("GPT2P_TEST_DATA");
  const fs::path repo = data != nullptr ? fs::path(data) / ".." / ".." : fs::current_path();
  return (repo / ".cache" / "gpt2-vocab").string();
}

// 64 short German/English training pairs (8 for validation and test), real tokenizer.
inline void write_small_dataset(const std::string& path, const std::string& vocab) {
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
  meta.source = "trainer_fixture";
  data::write_dataset_file(path, meta, {{"train", train}, {"validation", other}, {"test", other}});
}

// Skips without the vocabulary; otherwise one directory for the job (named by rank 0's pid) with
// data.h5 in it, removed afterwards.
class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    namespace fs = std::filesystem;
    if (!fs::exists(fs::path(vocab_dir()) / "encoder.json")) {
      GTEST_SKIP() << "no GPT-2 vocabulary at " << vocab_dir() << " (set GPT2P_VOCAB_DIR)";
    }
    auto pid = torch::tensor({static_cast<int64_t>(::getpid())});
    comm->broadcast(pid, 0);
    dir = (fs::temp_directory_path() / ("gpt2p_trainer_" + std::to_string(pid.item<int64_t>())))
              .string();
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

  // A 2-block, 32-wide model (n_layer = `blocks`) on the CPU, batch 12 x 16 tokens, checkpoints
  // every 2 steps, output in <dir>/<out>.
  parallel::TrainConfig config(const std::string& out, int64_t max_steps,
                               int64_t blocks = 2) const {
    parallel::TrainConfig c;
    c.model.preset = "tiny";
    c.model.n_layer = blocks;
    c.model.n_embd = 32;
    c.model.n_head = 2;
    c.model.dropout = 0;
    c.data.path = dir + "/data.h5";
    c.data.vocab_dir = vocab_dir();
    c.data.max_train_pairs = 0;
    c.data.max_eval_pairs = 8;
    c.optim.epochs = 1;
    c.optim.max_steps = max_steps;
    c.optim.batch_size = 12;
    c.optim.seq_len = 16;
    c.compute.device = gpt2p::parallel::DeviceKind::kCpu;
    c.output.out = dir + "/" + out;
    c.output.save_every = 2;
    c.output.translate_samples = 1;
    c.output.log_every = 1;
    return c;
  }
  std::string rank_file(const std::string& out) const {
    return dir + "/" + out + "/rank" + std::to_string(comm->rank()) + ".h5";
  }

  // Runs out_a and out_b ran `steps` steps each with the same losses, step by step, within 1e-5
  // relative: two ways of computing the same training.
  void expect_same_losses(const std::string& out_a, const std::string& out_b, size_t steps) const {
    const auto a = read_column(rank_file(out_a), "/steps/loss");
    const auto b = read_column(rank_file(out_b), "/steps/loss");
    ASSERT_EQ(a.size(), steps);
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(b[i])) << i;
  }

  // Run "a" stopped after 2 steps with a checkpoint, "b" resumed from it for step 2, and "c" ran 3
  // steps without stopping: a's two losses and b's one continue c's within rel_tol.
  void expect_resume_continues_the_run(double rel_tol) const {
    const auto full = read_column(rank_file("c"), "/steps/loss");
    ASSERT_EQ(full.size(), 3U);
    const auto head = read_column(rank_file("a"), "/steps/loss");
    ASSERT_EQ(head.size(), 2U);
    EXPECT_NEAR(head[0], full[0], rel_tol * full[0]);
    EXPECT_NEAR(head[1], full[1], rel_tol * full[1]);
    EXPECT_NEAR(read_column(rank_file("b"), "/steps/loss")[0], full[2], rel_tol * full[2])
        << "the resumed step must see the same batch and parameters as the uninterrupted run";
    EXPECT_NE(full[2], full[1]);
  }

  std::unique_ptr<comm::Communicator> comm = comm::make_mpi_communicator();
  Topology topo = query_topology(MPI_COMM_WORLD);
  std::string dir;
};

}  // namespace gpt2p::testing
