// core/fnv1a.h against the published FNV-1a 64 test vectors.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "gpt2p/core/fnv1a.h"

namespace gpt2p {
namespace {

std::string hash_of(const std::string& s) {
  Fnv1a64 h;
  h.add(s);
  return h.hex();
}

TEST(Fnv1a64, PublishedVectors) {
  EXPECT_EQ(hash_of(""), "cbf29ce484222325");
  EXPECT_EQ(hash_of("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(hash_of("foobar"), "85944171f73967e8");
}

TEST(Fnv1a64, PiecesHashAsTheWhole) {
  Fnv1a64 pieces;
  pieces.add("foo");
  const int32_t none[1] = {0};
  pieces.add(none, 0);
  pieces.add(std::string("bar"));
  EXPECT_EQ(pieces.hex(), hash_of("foobar"));
  EXPECT_EQ(Fnv1a64::to_hex(0x1ULL), "0000000000000001");
}

}  // namespace
}  // namespace gpt2p
