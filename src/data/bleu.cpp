#include "gpt2p/data/bleu.h"

#include <pcre2.h>

#include <cmath>
#include <map>
#include <sstream>

#include "gpt2p/core/error.h"

namespace gpt2p::data {
namespace {

// One compiled pattern with its replacement, applied globally like Python's re.sub.
class Substitution {
 public:
  Substitution(const char* pattern, const char* replacement) : replacement_(replacement) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF,
                          &err, &offset, nullptr);
    GPT2P_CHECK(code_ != nullptr, "bad 13a pattern at offset " << offset, "this is a bug");
  }
  ~Substitution() { pcre2_code_free(code_); }
  Substitution(const Substitution&) = delete;
  Substitution& operator=(const Substitution&) = delete;

  std::string apply(const std::string& in) const {
    std::string out(in.size() * 3 + 16, '\0');
    for (int attempt = 0; attempt < 2; ++attempt) {
      PCRE2_SIZE out_len = out.size();
      const int rc = pcre2_substitute(code_, reinterpret_cast<PCRE2_SPTR>(in.data()), in.size(), 0,
                                      PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH,
                                      nullptr, nullptr, reinterpret_cast<PCRE2_SPTR>(replacement_),
                                      PCRE2_ZERO_TERMINATED,
                                      reinterpret_cast<PCRE2_UCHAR*>(out.data()), &out_len);
      if (rc == PCRE2_ERROR_NOMEMORY) {  // out_len now holds the size needed
        out.resize(out_len);
        continue;
      }
      GPT2P_CHECK(rc >= 0, "13a substitution failed with PCRE2 code " << rc,
                  "check the text is valid UTF-8");
      out.resize(out_len);
      return out;
    }
    GPT2P_FAIL("13a substitution output did not fit", "this is a bug");
  }

 private:
  pcre2_code* code_ = nullptr;
  const char* replacement_;
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
}

using Ngrams = std::map<std::vector<std::string>, long long>;

Ngrams count_ngrams(const std::vector<std::string>& words, size_t n) {
  Ngrams counts;
  for (size_t i = 0; i + n <= words.size(); ++i) {
    counts[std::vector<std::string>(words.begin() + static_cast<long>(i),
                                    words.begin() + static_cast<long>(i + n))] += 1;
  }
  return counts;
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace

std::string tokenize_13a(const std::string& input) {
  // The same four rules, in the same order, as sacrebleu's TokenizerRegexp.
  static const Substitution kRules[] = {
      {R"(([\{-\~\[-\` -\&\(-\+\:-\@\/]))", " $1 "},
      {R"(([^0-9])([\.,]))", "$1 $2 "},
      {R"(([\.,])([^0-9]))", " $1 $2"},
      {R"(([0-9])(-))", "$1 $2 "},
  };
  std::string line = input;
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  line = " " + line + " ";
  for (const auto& rule : kRules) line = rule.apply(line);
  std::string out;
  for (const auto& w : split_words(line)) out += (out.empty() ? "" : " ") + w;
  return out;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::string>& references) {
  GPT2P_CHECK(hypotheses.size() == references.size(),
              hypotheses.size() << " hypotheses but " << references.size() << " references",
              "pass one reference per hypothesis");
  constexpr size_t kOrder = 4;
  std::vector<long long> correct(kOrder, 0);
  std::vector<long long> total(kOrder, 0);
  BleuScore r;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const auto hyp = split_words(tokenize_13a(hypotheses[i]));
    const auto ref = split_words(tokenize_13a(references[i]));
    r.sys_len += static_cast<long long>(hyp.size());
    r.ref_len += static_cast<long long>(ref.size());
    for (size_t n = 1; n <= kOrder; ++n) {
      const Ngrams h = count_ngrams(hyp, n);
      const Ngrams g = count_ngrams(ref, n);
      for (const auto& [gram, count] : h) {
        auto it = g.find(gram);
        if (it != g.end()) correct[n - 1] += std::min(count, it->second);
        total[n - 1] += count;
      }
    }
  }
  r.precisions.assign(kOrder, 0.0);
  double smooth = 1.0;
  for (size_t n = 0; n < kOrder; ++n) {
    if (total[n] == 0) break;
    if (correct[n] == 0) {
      smooth *= 2;
      r.precisions[n] = 100.0 / (smooth * static_cast<double>(total[n]));
    } else {
      r.precisions[n] = 100.0 * static_cast<double>(correct[n]) / static_cast<double>(total[n]);
    }
  }
  if (r.sys_len == 0) return r;
  r.brevity_penalty =
      r.sys_len >= r.ref_len
          ? 1.0
          : std::exp(1.0 - static_cast<double>(r.ref_len) / static_cast<double>(r.sys_len));
  double log_sum = 0;
  for (double p : r.precisions) log_sum += p > 0 ? std::log(p) : -9999999999.0;
  r.score = r.brevity_penalty * std::exp(log_sum / kOrder);
  return r;
}

}  // namespace gpt2p::data
