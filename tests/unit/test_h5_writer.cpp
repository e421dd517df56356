#include <H5Cpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/io/h5_writer.h"
#include "gpt2p/io/run_info.h"
#include "support/temp_dir.h"
#include "support/h5_read.h"

namespace fs = std::filesystem;
using gpt2p::io::H5Writer;

namespace {

using gpt2p::testing::read_column;


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
  EXPECT_EQ(gpt2p::io::utc_timestamp().size(), 20U);
}
