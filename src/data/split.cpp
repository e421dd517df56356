#include "gpt2p/data/split.h"

#include <utility>

#include "gpt2p/core/error.h"

namespace gpt2p::data {

void Split::add(const std::vector<int32_t>& src, const std::vector<int32_t>& tgt,
                const std::string& text_de, const std::string& text_en) {
  tokens_.insert(tokens_.end(), src.begin(), src.end());
  tokens_.insert(tokens_.end(), tgt.begin(), tgt.end());
  offsets_.push_back(static_cast<int64_t>(tokens_.size()));
  src_lengths_.push_back(static_cast<int32_t>(src.size()));
  text_de_.push_back(text_de);
  text_en_.push_back(text_en);
}

void Split::check_index(int64_t i) const {
  GPT2P_CHECK(i >= 0 && i < size(),
              "example index " << i << " is out of range [0, " << size() << ")",
              "index within the split's size()");
}

TokenSpan Split::src(int64_t i) const {
  check_index(i);
  return {tokens_.data() + offsets_[i], static_cast<size_t>(src_lengths_[i])};
}

TokenSpan Split::tgt(int64_t i) const {
  check_index(i);
  const int64_t start = offsets_[i] + src_lengths_[i];
  return {tokens_.data() + start, static_cast<size_t>(offsets_[i + 1] - start)};
}

const std::string& Split::text_de(int64_t i) const {
  check_index(i);
  return text_de_[i];
}

const std::string& Split::text_en(int64_t i) const {
  check_index(i);
  return text_en_[i];
}

int64_t Split::src_tokens() const {
  int64_t n = 0;
  for (const int32_t len : src_lengths_) n += len;
  return n;
}

int64_t Split::tgt_tokens() const { return static_cast<int64_t>(tokens_.size()) - src_tokens(); }

Split Split::from_arrays(std::vector<int32_t> tokens, std::vector<int64_t> offsets,
                         std::vector<int32_t> src_lengths, std::vector<std::string> text_de,
                         std::vector<std::string> text_en, const std::string& where) {
  const size_t n = src_lengths.size();
  const char* hint = "the file is damaged or was not written by prepare_data: rerun prepare_data";
  GPT2P_CHECK(offsets.size() == n + 1 && text_de.size() == n && text_en.size() == n,
              where << ": inconsistent lengths: offsets " << offsets.size() << ", src_lengths " << n
                    << ", text_de " << text_de.size() << ", text_en " << text_en.size()
                    << " (offsets must have n+1 entries)",
              hint);
  GPT2P_CHECK(offsets.front() == 0 && offsets.back() == static_cast<int64_t>(tokens.size()),
              where << ": offsets run from " << offsets.front() << " to " << offsets.back()
                    << " but there are " << tokens.size() << " tokens",
              hint);
  for (size_t i = 0; i < n; ++i) {
    // Differences only: offsets near INT64_MAX must not overflow the check.
    GPT2P_CHECK(offsets[i] <= offsets[i + 1],
                where << ": offsets go backwards at example " << i << " (" << offsets[i] << " then "
                      << offsets[i + 1] << ")",
                hint);
    GPT2P_CHECK(src_lengths[i] >= 0 && src_lengths[i] <= offsets[i + 1] - offsets[i],
                where << ": example " << i << " has src length " << src_lengths[i] << " but only "
                      << offsets[i + 1] - offsets[i] << " tokens",
                hint);
  }
  Split s;
  s.tokens_ = std::move(tokens);
  s.offsets_ = std::move(offsets);
  s.src_lengths_ = std::move(src_lengths);
  s.text_de_ = std::move(text_de);
  s.text_en_ = std::move(text_en);
  return s;
}

}  // namespace gpt2p::data
