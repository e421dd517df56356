// Bounded JSON input: depth and size limits, special files, and messages that name the source.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/io/json_input.h"
#include "support/temp_dir.h"

namespace gpt2p::io {
namespace {

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// The message of the gpt2p::Error `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonInput, ParsesOrdinaryJson) {
  const auto j = parse_json(R"({"a": [1, 2, {"b": "c"}], "d": 1.5})", "x.json", "fix x");
  EXPECT_EQ(j["a"][2]["b"], "c");
  EXPECT_DOUBLE_EQ(j["d"].get<double>(), 1.5);
}

TEST(JsonInput, AcceptsTheDepthLimitAndRefusesOneMore) {
  EXPECT_NO_THROW(parse_json(nested(kJsonMaxDepth), "ok.json", "fix"));
  const auto msg = error_of([] { parse_json(nested(kJsonMaxDepth + 1), "deep.json", "fix it"); });
  EXPECT_NE(msg.find("deep.json: JSON nested deeper than 64 levels"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fix: fix it"), std::string::npos) << msg;
}

TEST(JsonInput, RefusesNestingThatWouldExhaustTheStackWhenCopied) {
  // 100,000 levels: nlohmann::json parses it, but a copy or dump of it recurses 100,000 deep.
  const auto msg = error_of([] { parse_json(nested(100000), "header", "fix"); });
  EXPECT_NE(msg.find("nested deeper"), std::string::npos) << msg;
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(100000, '}');
    return s;
  }();
  EXPECT_NE(error_of([&] { parse_json(objects, "o", "fix"); }).find("nested deeper"),
            std::string::npos);
}

TEST(JsonInput, InvalidJsonNamesTheSource) {
  const auto msg = error_of([] { parse_json("{\"a\": ", "data.jsonl:7", "one object per line"); });
  EXPECT_NE(msg.find("data.jsonl:7: not valid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fix: one object per line"), std::string::npos) << msg;
}

TEST(JsonInput, RefusesTextOverTheSizeLimit) {
  const auto msg = error_of([] { parse_json("[1, 2, 3]", "big.json", "fix", 4); });
  EXPECT_NE(msg.find("big.json: 9 bytes of JSON, more than the 4"), std::string::npos) << msg;
}

TEST(JsonInput, ReadsARegularFile) {
  testing::TempDir dir("json_input");
  std::ofstream(dir / "c.json") << R"({"n_layer": 2})";
  EXPECT_EQ(read_json_file(dir / "c.json", "fix")["n_layer"], 2);
}

TEST(JsonInput, RefusesSpecialFilesMissingFilesAndLargeFiles) {
  testing::TempDir dir("json_input");
  // /dev/zero behind a symbolic link would otherwise be read until memory ran out.
  ASSERT_EQ(::symlink("/dev/zero", (dir / "config.json").c_str()), 0);
  auto msg = error_of([&] { read_json_file(dir / "config.json", "fix"); });
  EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;
  ASSERT_EQ(::mkfifo((dir / "fifo.json").c_str(), 0600), 0);
  msg = error_of([&] { read_json_file(dir / "fifo.json", "fix"); });  // must not block
  EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;
  msg = error_of([&] { read_json_file(dir / "missing.json", "fix"); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing.json"), std::string::npos) << msg;
  std::ofstream(dir / "big.json") << "[" << std::string(100, ' ') << "]";
  msg = error_of([&] { read_json_file(dir / "big.json", "fix", 50); });
  EXPECT_NE(msg.find("is 102 bytes, more than the 50"), std::string::npos) << msg;
}

TEST(JsonInput, NamesTypes) {
  EXPECT_STREQ(json_type_name(nlohmann::json::object()), "an object");
  EXPECT_STREQ(json_type_name(nlohmann::json::array()), "an array");
  EXPECT_STREQ(json_type_name("s"), "a string");
  EXPECT_STREQ(json_type_name(3), "an integer");
  EXPECT_STREQ(json_type_name(3.5), "a number");
  EXPECT_STREQ(json_type_name(nullptr), "null");
}

TEST(JsonInput, FieldsOfTheWrongTypeOrRangeNameTheSourceAndKey) {
  const auto j = nlohmann::json::parse(R"({"n": 5, "s": "x", "a": [1], "big": 18446744073709551615,
                                           "neg": -3, "f": 1.5})");
  EXPECT_EQ(json_field(j, "s", JsonType::kString, "m.json", "fix").get<std::string>(), "x");
  EXPECT_EQ(json_field(j, "a", JsonType::kArray, "m.json", "fix").size(), 1U);
  EXPECT_EQ(json_int_field(j, "n", 0, 10, "m.json", "fix"), 5);
  EXPECT_EQ(json_int_field(j, "neg", -3, 0, "m.json", "fix"), -3);
  for (const auto& [call, expect] : std::vector<std::pair<std::function<void()>, std::string>>{
           {[&] { json_field(j, "s", JsonType::kInteger, "m.json", "fix"); },
            "m.json: \"s\" is a string, not an integer -- fix: fix"},
           {[&] { json_field(j, "missing", JsonType::kObject, "m.json", "fix"); },
            "m.json has no \"missing\""},
           {[&] { json_field(nlohmann::json::array(), "k", JsonType::kObject, "m.json", "fix"); },
            "m.json is an array, not a JSON object"},
           {[&] { json_int_field(j, "f", 0, 10, "m.json", "fix"); },
            "m.json: \"f\" is a number, not an integer"},
           {[&] { json_int_field(j, "n", 6, 10, "m.json", "fix"); },
            "m.json: \"n\" is 5, outside [6, 10]"},
           {[&] {
              json_int_field(j, "neg", 0, std::numeric_limits<int64_t>::max(), "m.json", "f");
            },
            "m.json: \"neg\" is -3, not >= 0"},
           // 2^64 - 1 does not fit an int64_t: refused, not wrapped to -1.
           {[&] {
              json_int_field(j, "big", -5, std::numeric_limits<int64_t>::max(), "m.json", "f");
            },
            "m.json: \"big\" is 18446744073709551615, not >= -5"}}) {
    const auto msg = error_of(call);
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace gpt2p::io
