// Every enum the command line, the records and the messages name has one table of names
// (core/names.h). The tables must be complete and unambiguous: each value named once, each name
// unique, and name <-> value round trips.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "gpt2p/comm/backend.h"
#include "gpt2p/compat/attention_choice.h"
#include "gpt2p/core/names.h"
#include "gpt2p/model/options.h"
#include "gpt2p/parallel/train/options.h"
#include "gpt2p/pipeline/plan/partition.h"
#include "gpt2p/pipeline/plan/schedule.h"

namespace gpt2p {
namespace {

template <class E>
void expect_complete_table(size_t expected_values) {
  std::set<int> values;
  std::set<std::string> words;
  for (const auto& n : names(E{})) {
    values.insert(static_cast<int>(n.value));
    words.insert(std::string(n.name));
    EXPECT_FALSE(n.name.empty());
    EXPECT_EQ(n.name.find(' '), std::string_view::npos) << n.name;
    EXPECT_EQ(name_of(n.value), n.name);
    EXPECT_EQ(from_name<E>(n.name), n.value) << n.name;
  }
  EXPECT_EQ(values.size(), expected_values) << "a value is missing from the table or named twice";
  EXPECT_EQ(words.size(), expected_values) << "a name is used twice";
  // Enumerators are 0..N-1: the table covers them all.
  for (int v = 0; v < static_cast<int>(expected_values); ++v) EXPECT_TRUE(values.count(v)) << v;
  EXPECT_FALSE(from_name<E>("no-such-name").has_value());
  EXPECT_EQ(name_of(static_cast<E>(expected_values)), "?");
}

TEST(Names, EveryTableIsCompleteAndUnambiguous) {
  expect_complete_table<model::Precision>(4);
  expect_complete_table<model::LossPositions>(2);
  expect_complete_table<model::Kernels>(3);
  expect_complete_table<model::Recompute>(2);
  expect_complete_table<compat::Attention>(5);
  expect_complete_table<comm::Backend>(3);
  expect_complete_table<pipeline::ScheduleKind>(3);
  expect_complete_table<pipeline::PartitionKind>(3);
  expect_complete_table<parallel::DeviceKind>(3);
  expect_complete_table<parallel::GradSyncMode>(2);
  expect_complete_table<parallel::LossScaleMode>(3);
  expect_complete_table<parallel::ReduceDtype>(2);
  expect_complete_table<parallel::EmbeddingSync>(2);
  expect_complete_table<parallel::PipelineMode>(2);
}

TEST(Names, ChoicesListTheNamesInTableOrder) {
  EXPECT_EQ(choices<model::Precision>(), "fp32 | tf32 | bf16 | fp16");
  EXPECT_EQ(choices<parallel::GradSyncMode>(", "), "per-param, bucketed");
  static_assert(name_of(pipeline::ScheduleKind::kOneFOneB) == "1f1b");
  static_assert(from_name<comm::Backend>("nccl") == comm::Backend::kNccl);
}

}  // namespace
}  // namespace gpt2p
