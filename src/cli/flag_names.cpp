#include "flag_names.h"

#include <algorithm>
#include <cctype>

namespace gpt2p::cli {

std::vector<std::string> long_names(const po::options_description& desc) {
  std::vector<std::string> names;
  for (const auto& d : desc.options()) {
    if (!d->long_name().empty()) names.push_back(d->long_name());
  }
  return names;
}

const po::option_description* find_long(const po::options_description& desc,
                                        const std::string& name) {
  for (const auto& d : desc.options()) {
    if (d->long_name() == name) return d.get();
  }
  return nullptr;
}

std::string as_flag_name(const std::string& word) {
  std::string out = word.substr(std::min(word.find_first_not_of('-'), word.size()));
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (c == '_' || c == ' ') c = '-';
  }
  return out;
}

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
// two neighbouring characters, each costing 1.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The names closest to `word`, at most 3: the name it spells with other dashes, underscores or
// case; else the nearest names within a few edits (more for longer words); else the names it
// begins (--max for --max-steps, as prefix guessing took it); else the names it begins with
// (--output for --out).
std::vector<std::string> closest(const std::string& word, const std::vector<std::string>& names) {
  const std::string w = as_flag_name(word);
  if (w.size() < 2) return {};
  for (const auto& name : names) {
    if (name == w) return {name};
  }
  const size_t limit = w.size() <= 4 ? 1 : w.size() <= 8 ? 2 : 3;
  size_t best = limit + 1;
  std::vector<std::string> out;
  for (const auto& name : names) {
    const size_t d = edit_distance(w, name);
    if (d > limit || d > best || d >= name.size()) continue;  // d >= size: nothing is left
    if (d < best) out.clear();
    best = d;
    out.push_back(name);
  }
  if (out.empty() && w.size() >= 3) {
    for (const auto& name : names) {
      if (name.compare(0, w.size(), w) == 0) out.push_back(name);
    }
  }
  if (out.empty()) {  // --output, --lr-rate: a flag and more
    for (const auto& name : names) {
      if (name.size() >= 2 && w.compare(0, name.size(), name) == 0) out.push_back(name);
    }
  }
  if (out.size() > 3) out.resize(3);
  return out;
}

}  // namespace

std::string did_you_mean(const std::string& word, const std::vector<std::string>& names,
                         const std::string& prefix) {
  const auto near = closest(word, names);
  if (near.empty()) return "";
  std::string out = ": did you mean ";
  for (size_t i = 0; i < near.size(); ++i) {
    if (i > 0) out += i + 1 == near.size() ? " or " : ", ";
    out += prefix + near[i];
  }
  return out + "?";
}

}  // namespace gpt2p::cli
