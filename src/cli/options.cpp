#include "gpt2p/cli/options.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "flag_names.h"

namespace gpt2p::cli {

namespace {

// Every flag written out in full: Boost's default guesses a flag from a unique prefix, which takes
// a misspelled --epoch for --epochs without a word. Short flags (-h) and the other defaults stay.
constexpr int kStyle =
    po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

const char* const kConfigHelp =
    "read flags from FILE: one 'name = value' a line, name a long flag without the dashes "
    "('batch-size = 32', a switch as 'overwrite = true'), '#' starts a comment; a flag on the "
    "command line wins over the file's line";

// The whitespace Boost trims from both ends of a config file's names and values.
bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string trim(const std::string& s) {
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end && is_blank(s[begin])) ++begin;
  while (end > begin && is_blank(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

std::string help_hint(const std::string& program) {
  return " (run '" + program + " --help' for the flags)";
}

// What --config names: its path, and the line each key is on.
struct ConfigFile {
  std::string path;
  std::map<std::string, int> line_of;

  std::string where(const std::string& key) const {
    const auto it = line_of.find(key);
    return "config file '" + path + "'" +
           (it == line_of.end() ? "" : ", line " + std::to_string(it->second));
  }
};

std::string read_config_text(const std::string& path) {
  const auto fail = [&path](const char* what, int err) {
    return UsageError("--config '" + path + "': cannot " + what + " it (" + std::strerror(err) +
                      "): pass a readable file of 'name = value' lines");
  };
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw fail("open", errno);
  std::string text;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const int err = errno;
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) throw fail("read", err);
  return text;
}

// Checks every line of a config file the way Boost reads it ('#' to the end of the line is a
// comment; blank lines are skipped; other lines are `name = value`), refusing what Boost would
// take silently or report without a line: sections, keys that are not long flags (with the
// closest ones), config and help, a key set twice. Records the line of each key.
void scan_config_text(const std::string& text, const std::string& program,
                      const po::options_description& desc, ConfigFile& file) {
  const auto names = long_names(desc);
  std::vector<std::string> settable;
  for (const auto& name : names) {
    if (name != "help" && name != "config") settable.push_back(name);
  }
  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    const std::string at =
        "config file '" + file.path + "', line " + std::to_string(line_no) + ": ";
    const std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    if (line.front() == '[' && line.back() == ']') {
      throw UsageError(at + "sections such as '" + line +
                       "' are not read: write the flags as 'name = value' lines without one");
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      const size_t gap = line.find_first_of(" \t");
      const std::string fix = gap == std::string::npos ? as_flag_name(line) + " = VALUE"
                                                       : as_flag_name(line.substr(0, gap)) + " = " +
                                                             trim(line.substr(gap));
      throw UsageError(at + "'" + line + "' is not a 'name = value' line: write it as '" + fix +
                       "'");
    }
    const std::string key = trim(line.substr(0, eq));
    if (key.empty()) {
      throw UsageError(at + "'" + line + "' has no name before '=': write 'name = value'");
    }
    if (key == "config") {
      throw UsageError(at +
                       "a config file cannot name another (config = ...): remove the line "
                       "and pass one file with --config");
    }
    if (key == "help") {
      throw UsageError(at + "help cannot be set in a config file: remove the line (run '" +
                       program + " --help' instead)");
    }
    if (find_long(desc, key) == nullptr) {
      throw UsageError(at + "unknown key '" + key + "'" + did_you_mean(key, settable, "") +
                       " (keys are the long flags of '" + program + " --help' without the dashes)");
    }
    const auto [it, fresh] = file.line_of.emplace(key, line_no);
    if (!fresh) {
      throw UsageError(at + "'" + key + "' is already set on line " + std::to_string(it->second) +
                       ": keep one of the two lines");
    }
  }
}

// Stores the file's values under those of the command line (stored first, so they win: Boost
// keeps an option's first stored value), one option at a time so that an error names its line.
void store_config_file(const std::string& program, const po::options_description& desc,
                       po::variables_map& vm, ConfigFile& file) {
  const std::string text = read_config_text(file.path);
  scan_config_text(text, program, desc, file);
  std::istringstream in(text);
  po::parsed_options parsed(&desc);
  try {
    parsed = po::parse_config_file(in, desc, /*allow_unregistered=*/false);
  } catch (const po::error& e) {
    throw UsageError("config file '" + file.path + "': " + e.what() +
                     ": write one 'name = value' a line" + help_hint(program));
  }
  for (const auto& option : parsed.options) {
    po::parsed_options one(&desc);
    one.options.push_back(option);
    try {
      po::store(one, vm);
    } catch (const po::error& e) {
      const std::string value = option.value.empty() ? "" : option.value.front();
      throw UsageError(file.where(option.string_key) + ": " + option.string_key + " = " + value +
                       ": " + e.what() + help_hint(program));
    }
  }
}

// po::notify, one option at a time: an error from a value the config file set names its line.
void notify(const std::string& program, const po::options_description& desc, po::variables_map& vm,
            const std::set<std::string>& on_command_line, const std::vector<ConfigFile>& files) {
  // The file whose line set `name` (the first that has it: it was stored first), or null.
  const auto file_of = [&](const std::string& name) -> const ConfigFile* {
    if (on_command_line.count(name) != 0U) return nullptr;
    for (const ConfigFile& f : files) {
      if (f.line_of.count(name) != 0U) return &f;
    }
    return nullptr;
  };
  for (const auto& d : desc.options()) {
    const auto it = vm.find(d->long_name());
    if (d->semantic()->is_required() && (it == vm.end() || it->second.empty())) {
      const std::string line = files.empty() ? ""
                                             : " (pass it, or a '" + d->long_name() +
                                                   " = ...' line in '" + files.front().path + "')";
      throw UsageError(po::required_option("--" + d->long_name()).what() + line +
                       help_hint(program));
    }
  }
  for (auto& [name, value] : vm) {
    const po::option_description* d = find_long(desc, name);
    if (d == nullptr) continue;
    const ConfigFile* file = file_of(name);
    try {
      d->semantic()->notify(value.value());
    } catch (const po::error& e) {
      throw UsageError((file != nullptr ? file->where(name) + ": " : "") + e.what() +
                       help_hint(program));
    } catch (const UsageError& e) {
      if (file == nullptr) throw;
      throw UsageError(file->where(name) + ": " + e.what());
    }
  }
}

// "unrecognised option '--epoch': did you mean --epochs?"
std::string unknown_flag(const std::string& token, const po::options_description& desc) {
  const std::string flag = token.substr(0, token.find('='));  // --epoch=3: the flag is --epoch
  return "unrecognised option '" + flag + "'" + did_you_mean(flag, long_names(desc), "--");
}

// A word on the command line that no flag takes, which Boost would drop without a word: a value
// given to a switch (--overwrite false turns it on) or a second value (--epochs 1 2).
std::string stray_word(const std::string& word, int argc, char** argv,
                       const po::options_description& desc) {
  for (int i = 2; i < argc; ++i) {
    if (word != argv[i]) continue;
    const std::string before = argv[i - 1];
    const auto* d = before.rfind("--", 0) == 0 ? find_long(desc, before.substr(2)) : nullptr;
    if (d != nullptr && d->semantic()->max_tokens() == 0) {
      return before + " is a switch and takes no value: drop '" + word +
             "' (a switch is off unless given; turn off one a config file sets in the file)";
    }
    break;
  }
  return "unexpected argument '" + word + "': a value follows its flag, as --name VALUE";
}

}  // namespace

bool parse_or_help(const std::string& program, const std::string& summary,
                   po::options_description& desc, int argc, char** argv, po::variables_map& vm,
                   const std::function<std::string(const po::variables_map&)>& base_config) {
  desc.add_options()("help,h", "print this help and exit")(
      "config", po::value<std::string>()->value_name("FILE"), kConfigHelp);
  std::set<std::string> on_command_line;
  try {
    const auto parsed = po::command_line_parser(argc, argv).options(desc).style(kStyle).run();
    for (const auto& option : parsed.options) {
      if (option.string_key.empty()) {
        const std::string word = option.value.empty() ? "" : option.value.front();
        throw UsageError(stray_word(word, argc, argv, desc) + help_hint(program));
      }
      on_command_line.insert(option.string_key);
    }
    po::store(parsed, vm);
  } catch (const po::unknown_option& e) {
    throw UsageError(unknown_flag(e.get_option_name(), desc) + help_hint(program));
  } catch (const po::multiple_occurrences& e) {
    if (e.get_option_name() == "--config") {
      throw UsageError(
          "--config is given more than once: pass one config file (flags on the "
          "command line override its lines)");
    }
    throw UsageError(std::string(e.what()) + help_hint(program));
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + help_hint(program));
  }
  if (vm.count("help") != 0U) {
    std::cout << "usage: " << program << " [options]\n" << summary << "\n\n" << desc << "\n";
    return false;
  }
  std::vector<ConfigFile> files;
  if (vm.count("config") != 0U) {
    files.push_back({vm["config"].as<std::string>(), {}});
    store_config_file(program, desc, vm, files.back());
  }
  if (base_config) {
    if (std::string base = base_config(vm); !base.empty()) {
      files.push_back({std::move(base), {}});
      store_config_file(program, desc, vm, files.back());
    }
  }
  notify(program, desc, vm, on_command_line, files);
  return true;
}

std::string to_config_file(const ConfigEntries& entries, const po::options_description& desc,
                           const std::string& comment) {
  std::ostringstream out;
  if (!comment.empty()) {
    std::istringstream lines(comment);
    std::string line;
    while (std::getline(lines, line)) out << (line.empty() ? "#" : "# " + line) << "\n";
  }
  std::set<std::string> seen;
  for (const auto& [name, value] : entries) {
    const auto refuse = [&](const std::string& why) {
      throw std::invalid_argument("to_config_file: '" + name + " = " + value + "': " + why);
    };
    const po::option_description* d = find_long(desc, name);
    if (name == "help" || name == "config") refuse("a config file does not set " + name);
    if (d == nullptr) refuse("'" + name + "' is not a long flag of these options");
    if (!seen.insert(name).second) refuse("'" + name + "' is given twice");
    if (value.find_first_of("#\r\n") != std::string::npos) {
      refuse("a '#' or a line break would not read back from a config file");
    }
    if (!value.empty() && (is_blank(value.front()) || is_blank(value.back()))) {
      refuse("spaces at either end of a value are dropped when it is read back");
    }
    boost::any parsed;
    try {
      d->semantic()->parse(parsed, {value}, /*utf8=*/true);
    } catch (const po::error& e) {
      refuse(std::string("the flag does not take this value: ") + e.what());
    }
    out << name << " = " << value << "\n";
  }
  return out.str();
}

std::string config_value(double v) {
  char buf[40];
  // A whole number as a person writes it ("60", not %g's "6e+01"), while that is exact.
  if (std::abs(v) < 1e15 && v == std::trunc(v)) {
    std::snprintf(buf, sizeof buf, "%.0f", v == 0 ? 0.0 : v);  // no "-0"
    return buf;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace gpt2p::cli
