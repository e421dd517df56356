#include <H5Cpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/core/process_info.h"
#include "gpt2p/io/action_ops.h"
#include "gpt2p/io/h5_writer.h"
#include "gpt2p/io/run_info.h"
#include "gpt2p/io/run_record.h"
#include "support/h5_read.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using gpt2p::io::H5Writer;
using gpt2p::io::RecordMode;
using gpt2p::io::RunRecorder;

namespace {

using gpt2p::testing::read_column;

gpt2p::io::RunIdentity identity(int world_size = 2) {
  gpt2p::io::RunIdentity id;
  id.program = "dp_train";
  id.config_json = "{}";
  id.world_size = world_size;
  id.rank = 0;
  return id;
}

// A run that records `steps` steps from `first` on and one epoch row, then closes.
void record(const std::string& dir, long long first, int steps, RecordMode mode,
            int world_size = 2) {
  RunRecorder rec(dir, identity(world_size), mode);
  for (long long s = first; s < first + steps; ++s) {
    gpt2p::io::StepRecord r;
    r.step = s;
    r.loss = static_cast<double>(100 + s);
    rec.step(r);
  }
  rec.epoch({});
  rec.close();
}

std::string error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const gpt2p::Error& e) {
    return std::string(e.what()) + " | hint: " + e.hint();
  }
  return "(no error)";
}

}  // namespace

TEST(H5Writer, AppendsRowsAndRenamesOnClose) {
  const gpt2p::testing::TempDir dir("h5_rows");
  const std::string path = dir / "rank0.h5";
  {
    H5Writer w(path);
    w.set_attribute("config", std::string(R"({"a":1})"));
    w.set_attribute("world_size", 2LL);
    w.add_table("steps", {"step", "loss"});
    w.append("steps", {0, 2.5});
    w.append("steps", {1, 2.25});
    EXPECT_EQ(w.rows("steps"), 2);
    EXPECT_TRUE(fs::exists(path + ".partial"));
    EXPECT_FALSE(fs::exists(path));
  }
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
  EXPECT_EQ(read_column(path, "steps/step"), (std::vector<double>{0, 1}));
  EXPECT_EQ(read_column(path, "steps/loss"), (std::vector<double>{2.5, 2.25}));
}

TEST(H5Writer, PartialFileKeepsFlushedRows) {
  const gpt2p::testing::TempDir dir("h5_partial");
  const std::string path = dir / "rank1.h5";
  auto w = std::make_unique<H5Writer>(path);
  w->add_table("steps", {"step"});
  for (int i = 0; i < 300; ++i) w->append("steps", {static_cast<double>(i)});
  // Without close(), the flushed rows are readable from the .partial file.
  EXPECT_EQ(read_column(path + ".partial", "steps/step").size(), 300U);
  w->close();
  EXPECT_EQ(read_column(path, "steps/step").back(), 299.0);
}

TEST(H5Writer, AContinuedTableGainsTheColumnsALaterVersionAdded) {
  const gpt2p::testing::TempDir dir("h5_added");
  const std::string path = dir / "rank0.h5";
  {  // An older version's file: no loss_scale column.
    H5Writer w(path);
    w.add_table("steps", {"step", "loss"});
    w.append("steps", {0, 2.5});
    w.append("steps", {1, 2.25});
  }
  {
    H5Writer w(path, RecordMode::kAppend);
    w.add_table("steps", {"step", "loss", "loss_scale"});
    EXPECT_EQ(w.rows("steps"), 2);
    w.append("steps", {2, 2.0, 1024});
  }
  EXPECT_EQ(read_column(path, "steps/step"), (std::vector<double>{0, 1, 2}));
  const auto scale = read_column(path, "steps/loss_scale");
  ASSERT_EQ(scale.size(), 3U);
  EXPECT_TRUE(std::isnan(scale[0]) && std::isnan(scale[1])) << scale[0] << " " << scale[1];
  EXPECT_EQ(scale[2], 1024);
}

TEST(H5Writer, RejectsRowOfWrongWidthAndUnknownTable) {
  const gpt2p::testing::TempDir dir("h5_bad");
  H5Writer w(dir / "r.h5");
  w.add_table("steps", {"a", "b"});
  try {
    w.append("steps", {1.0});
    FAIL() << "expected an error";
  } catch (const gpt2p::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row of 1 values"), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.append("nope", {1.0}), gpt2p::Error);
  w.close();
}

TEST(H5Writer, UnwritableDirectoryIsAClearError) {
  try {
    H5Writer w("/proc/definitely/not/writable/rank0.h5");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/definitely"), std::string::npos) << e.what();
  }
}

TEST(RunInfo, VersionsNameTheLibraries) {
  auto v = gpt2p::io::library_versions();
  for (const char* key : {"git_commit", "torch", "mpi", "hdf5", "boost"}) {
    ASSERT_TRUE(v.contains(key)) << key;
    EXPECT_FALSE(v[key].get<std::string>().empty()) << key;
  }
  EXPECT_EQ(gpt2p::utc_timestamp().size(), 20U);
}

TEST(RunRecorder, NamesEveryActionOpCodeInTheFile) {
  const gpt2p::testing::TempDir dir("rec_ops");
  record(dir.str(), 0, 1, RecordMode::kCreate);
  H5::H5File f(dir / "rank0.h5", H5F_ACC_RDONLY);
  const H5::Attribute a = f.openAttribute("action_ops");
  std::string text;
  a.read(a.getStrType(), text);
  EXPECT_EQ(text, gpt2p::io::action_ops_json());
  for (const char* name : {"\"0\":\"forward\"", "\"6\":\"optimizer\"", "\"7\":\"weight grad\""}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << " in " << text;
  }
}

TEST(RunRecorder, AppendKeepsTheEarlierRowsAndMarksWhereEachRunBegins) {
  const gpt2p::testing::TempDir dir("rec_append");
  const std::string path = dir / "rank0.h5";
  record(dir.str(), 0, 3, RecordMode::kCreate);
  record(dir.str(), 2, 2, RecordMode::kAppend);  // resumed at step 2
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
  EXPECT_EQ(read_column(path, "steps/step"), (std::vector<double>{0, 1, 2, 2, 3}));
  EXPECT_EQ(read_column(path, "steps/loss"), (std::vector<double>{100, 101, 102, 102, 103}));
  EXPECT_EQ(read_column(path, "epochs/epoch").size(), 2U);
  EXPECT_EQ(read_column(path, "segments/steps_row"), (std::vector<double>{0, 3}));
  EXPECT_EQ(read_column(path, "segments/epochs_row"), (std::vector<double>{0, 1}));
  EXPECT_EQ(read_column(path, "segments/actions_row"), (std::vector<double>{0, 0}));
  // kCreate still starts over.
  record(dir.str(), 0, 1, RecordMode::kCreate);
  EXPECT_EQ(read_column(path, "steps/step"), (std::vector<double>{0}));
  EXPECT_EQ(read_column(path, "segments/steps_row"), (std::vector<double>{0}));
}

TEST(RunRecorder, AppendContinuesThePartialFileACrashLeft) {
  const gpt2p::testing::TempDir dir("rec_crash");
  const std::string path = dir / "rank0.h5";
  {
    RunRecorder crashed(dir.str(), identity(), RecordMode::kCreate);
    crashed.step({});
    fs::copy_file(path + ".partial", dir / "copy.h5");  // what the crash leaves behind
  }
  fs::remove(path);
  fs::rename(dir / "copy.h5", path + ".partial");
  record(dir.str(), 1, 1, RecordMode::kAppend);
  EXPECT_EQ(read_column(path, "steps/step"), (std::vector<double>{0, 1}));
  EXPECT_FALSE(fs::exists(path + ".partial"));
  // Without any file, kAppend creates one.
  const gpt2p::testing::TempDir empty("rec_none");
  record(empty.str(), 0, 2, RecordMode::kAppend);
  EXPECT_EQ(read_column(empty / "rank0.h5", "segments/steps_row"), (std::vector<double>{0}));
}

TEST(RunRecorder, AppendRefusesAnotherRunsFileAndLeavesItAsItWas) {
  const gpt2p::testing::TempDir dir("rec_other");
  const std::string path = dir / "rank0.h5";
  record(dir.str(), 0, 2, RecordMode::kCreate, /*world_size=*/2);
  auto text = error_text([&] { record(dir.str(), 2, 1, RecordMode::kAppend, 4); });
  EXPECT_NE(text.find("cannot continue timing file " + path +
                      ": it records world_size 2, this run has 4"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("move it out of --out"), std::string::npos) << text;
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
  EXPECT_EQ(read_column(path, "steps/step"), (std::vector<double>{0, 1}));

  {  // Other columns: a file of another version.
    H5Writer w(path);
    w.set_attribute("program", std::string("dp_train"));
    w.set_attribute("world_size", 2LL);
    w.set_attribute("rank", 0LL);
    w.add_table("steps", {"step", "seconds"});
    w.append("steps", {0, 1});
  }
  text = error_text([&] { record(dir.str(), 1, 1, RecordMode::kAppend); });
  EXPECT_NE(text.find("table 'steps' has columns seconds, step but this program records"),
            std::string::npos)
      << text;
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(read_column(path, "steps/seconds"), (std::vector<double>{1}));
}
