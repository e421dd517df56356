// fuzz_parsers: a bounded-time fuzz test of every torch-free parser of files that other people and
// programs make: JSON (io::parse_json, io::read_json_file), safetensors headers
// (io::parse_safetensors_header), GPT-2 vocabularies (data::BpeTokenizer::from_dir), corpora
// (data::read_jsonl, data::read_parallel, data::read_ding) and dataset files
// (data::DatasetFile::open and ::from_image).
//
// Each iteration builds a valid input of one kind (in memory, from nothing outside this program),
// mutates it with a random generator seeded by (seed, iteration) alone, and runs the parser on it.
// A parser may refuse an input only by throwing gpt2p::Error. Everything else is a finding: another
// exception escaping, an accepted input that breaks what callers rely on (a tensor outside the
// file, a decode that does not give back the text), one allocation larger than --max-alloc-mb, an
// iteration longer than --timeout, and (the target is built with AddressSanitizer and UBSan) any
// memory error or undefined behaviour. The input of a finding is saved to
// <findings-dir>/<parser>-seed<S>-iter<I>/ and the line that reports it says how to replay it.
//
// Dataset files run in a child process each. Most are sealed after they are changed (a valid
// checksum block, data/dataset_seal.h, as a deliberately crafted file would have), so that the
// HDF5 reading behind the checksum is what is fuzzed, through DatasetFile::from_image; the rest go
// through DatasetFile::open, checksum and isolated probe included. libhdf5 (1.10) itself crashes,
// hangs or allocates without bound on some files whose bytes were changed after it wrote them:
// from_image cannot prevent that (open turns it into an error line), so such a failure (inside
// libhdf5, on memory the project did not allocate or that was already freed, on a byte-corrupted
// file) is printed and counted as a "libhdf5 crash", not as a finding, unless --strict-hdf5. Any
// failure on a file that HDF5 wrote itself, and any on memory of the project's, is a finding.
//
//   fuzz_parsers --seconds 60                        # random seed, printed
//   fuzz_parsers --seed 7 --iterations 20000         # the same run again
//   fuzz_parsers --seed 7 --iteration 1234           # just iteration 1234 of seed 7
//   fuzz_parsers --replay safetensors /tmp/fuzz-findings/safetensors-seed7-iter1234
//
// Not a GoogleTest program: it prints one summary line (executions, rejected and accepted inputs
// per parser, findings) and exits 0 when there was no finding, 1 when there was one, 2 on a
// problem of its own (bad arguments, a temporary directory it cannot write).
#include <H5Cpp.h>
#include <cxxabi.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "gpt2p/core/error.h"
#include "gpt2p/data/bpe_tokenizer.h"
#include "gpt2p/data/byte_unicode.h"
#include "gpt2p/data/corpus.h"
#include "gpt2p/data/dataset_file.h"
#include "gpt2p/data/dataset_seal.h"
#include "gpt2p/data/ding.h"
#include "gpt2p/io/json_input.h"
#include "gpt2p/io/safetensors_header.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             size_t),
                                                         void (*free_hook)(const volatile void*));
#define FUZZ_WITH_ASAN 1
#else
#define FUZZ_WITH_ASAN 0
#endif

namespace {

using nlohmann::json;
using Rng = std::mt19937_64;
namespace fs = std::filesystem;
using gpt2p::data::BpeTokenizer;
using gpt2p::data::DatasetFile;
using gpt2p::data::DatasetMeta;
using gpt2p::data::Split;

// ================================================================================================
// Inputs, findings, and how a finding's input is saved (also from a signal or a sanitizer's death)
// ================================================================================================

struct File {
  std::string name;  // a plain file name: the parser reads it from a temporary directory
  std::string bytes;
};

struct Input {
  std::vector<File> files;
  uint64_t knob = 0;  // parser options (e.g. read_ding's), saved beside the files as "knob"
};

// An accepted input that breaks what a caller relies on.
struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A problem of the fuzzer itself (not a finding).
struct HarnessError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr size_t kMaxInput = size_t{4} << 20;

// What the iteration under way runs, for the death callback and the watchdog.
const Input* g_current = nullptr;
char g_finding_dir[4096] = "";
char g_replay_line[512] = "";
std::string g_findings_base = "/tmp/fuzz-findings";
std::atomic<size_t> g_largest_alloc{0};
size_t g_alloc_limit = size_t{256} << 20;
std::atomic<bool> g_alloc_reported{false};

void raw_write(int fd, const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void raw_print(const char* s) { raw_write(2, s, std::strlen(s)); }

// Writes the current input under g_finding_dir with open/write/close only: callable from a signal
// handler and from a sanitizer's death callback while the parser is stopped in the middle.
void save_current_input() {
  if (g_current == nullptr || g_finding_dir[0] == '\0') return;
  ::mkdir(g_findings_base.c_str(), 0755);
  ::mkdir(g_finding_dir, 0755);
  char path[4600];
  auto write_file = [&](const char* name, const char* data, size_t n) {
    const size_t dn = std::strlen(g_finding_dir);
    const size_t nn = std::strlen(name);
    if (dn + 1 + nn + 1 > sizeof path) return;
    std::memcpy(path, g_finding_dir, dn);
    path[dn] = '/';
    std::memcpy(path + dn + 1, name, nn + 1);
    const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    raw_write(fd, data, n);
    ::close(fd);
  };
  for (const File& f : g_current->files) write_file(f.name.c_str(), f.bytes.data(), f.bytes.size());
  char knob[32];
  size_t k = sizeof knob;
  uint64_t v = g_current->knob;
  knob[--k] = '\n';
  do {
    knob[--k] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  write_file("knob", knob + k, sizeof knob - k);
}

// Per parser counts, kept in plain globals so that the summary can also be printed from a signal
// handler or a sanitizer's death callback (a hang or a crash ends the run there).
struct Counts {
  const char* name = "";
  uint64_t runs = 0, rejected = 0, accepted = 0, findings = 0, third_party = 0;
};
Counts g_counts[16];
size_t g_n_counts = 0;
size_t g_current_target = 0;  // index into g_counts of the iteration under way
uint64_t g_seed = 0, g_done = 0, g_findings = 0;
timespec g_start{};

struct RawText {  // appends without allocating
  char buf[2048];
  size_t n = 0;
  void add(const char* s) {
    while (*s != '\0' && n + 1 < sizeof buf) buf[n++] = *s++;
  }
  void add(uint64_t v) {
    char d[24];
    size_t k = 0;
    do {
      d[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v > 0);
    while (k > 0 && n + 1 < sizeof buf) buf[n++] = d[--k];
  }
};

// "fuzz_parsers: seed S, N executions in T s: json 10 (rejected 7, accepted 3); ... findings F"
void print_summary() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t tenths =
      (now.tv_sec - g_start.tv_sec) * 10 + (now.tv_nsec - g_start.tv_nsec) / 100000000;
  RawText t;
  t.add("fuzz_parsers: seed ");
  t.add(g_seed);
  t.add(", ");
  t.add(g_done);
  t.add(" executions in ");
  t.add(static_cast<uint64_t>(tenths / 10));
  t.add(".");
  t.add(static_cast<uint64_t>(tenths % 10));
  t.add(" s:");
  for (size_t i = 0; i < g_n_counts; ++i) {
    const Counts& c = g_counts[i];
    t.add(" ");
    t.add(c.name);
    t.add(" ");
    t.add(c.runs);
    t.add(" (rejected ");
    t.add(c.rejected);
    t.add(", accepted ");
    t.add(c.accepted);
    if (c.findings > 0) {
      t.add(", findings ");
      t.add(c.findings);
    }
    if (c.third_party > 0) {
      t.add(", libhdf5 crashes ");
      t.add(c.third_party);
    }
    t.add(");");
  }
  t.add(" findings ");
  t.add(g_findings);
  t.add("\n");
  raw_write(1, t.buf, t.n);
}

void report_crash_and_save(const char* what) {
  if (g_current == nullptr) {
    raw_print("\nfuzz_parsers: the fuzzer itself failed while it built an input (");
    raw_print(what);
    raw_print(")\n");
    return;
  }
  raw_print("\nfuzz_parsers: FINDING (");
  raw_print(what);
  raw_print(") ");
  raw_print(g_replay_line);
  raw_print("\nfuzz_parsers: input saved to ");
  raw_print(g_finding_dir);
  raw_print("\n");
  save_current_input();
}

bool g_in_child_flag = false;  // set in a child of run_in_child: its parent reports
char g_tmp_raw[4096] = "";     // this process's temporary directory, for remove_tree_raw

// Removes a directory tree with plain system calls: the run is ending in a signal handler or a
// sanitizer's death callback, where the parser may have left the heap in any state.
void remove_tree_raw(const char* path, int depth = 0) {
  if (depth > 4) return;
  if (DIR* d = ::opendir(path)) {
    while (const dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      char child[4600];
      const size_t pn = std::strlen(path), en = std::strlen(e->d_name);
      if (pn + 1 + en + 1 > sizeof child) continue;
      std::memcpy(child, path, pn);
      child[pn] = '/';
      std::memcpy(child + pn + 1, e->d_name, en + 1);
      if (::unlink(child) != 0) remove_tree_raw(child, depth + 1);
    }
    ::closedir(d);
  }
  ::rmdir(path);
}

void on_sanitizer_death() {
  if (g_in_child_flag) return;
  report_crash_and_save("sanitizer report above");
  ++g_counts[g_current_target].findings;
  ++g_findings;
  ++g_done;
  print_summary();
  if (g_tmp_raw[0] != '\0') remove_tree_raw(g_tmp_raw);
}

void on_alarm(int) {
  if (g_in_child_flag) {
#if FUZZ_WITH_ASAN
    __sanitizer_print_stack_trace();  // into the report file: where it hung
#endif
    ::_exit(23);
  }
  report_crash_and_save("hang: the iteration ran past --timeout");
#if FUZZ_WITH_ASAN
  __sanitizer_print_stack_trace();
#endif
  ++g_counts[g_current_target].findings;
  ++g_findings;
  ++g_done;
  print_summary();
  if (g_tmp_raw[0] != '\0') remove_tree_raw(g_tmp_raw);
  ::_exit(1);
}

#if FUZZ_WITH_ASAN
void free_hook(const volatile void*) {}
void malloc_hook(const volatile void*, size_t size) {
  size_t seen = g_largest_alloc.load(std::memory_order_relaxed);
  while (size > seen && !g_largest_alloc.compare_exchange_weak(seen, size)) {
  }
  if (size > g_alloc_limit && !g_alloc_reported.exchange(true)) {
    raw_print("\nfuzz_parsers: an allocation larger than --max-alloc-mb, from:\n");
    __sanitizer_print_stack_trace();
  }
}
#endif

std::string current_exception_type() {
  const std::type_info* t = abi::__cxa_current_exception_type();
  if (t == nullptr) return "unknown";
  int status = 0;
  char* name = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : t->name();
  std::free(name);
  return out;
}

// ================================================================================================
// Random helpers and mutations
// ================================================================================================

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t below(Rng& r, uint64_t n) { return n == 0 ? 0 : r() % n; }
bool chance(Rng& r, double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(r) < p; }
template <class T>
const T& pick(Rng& r, const std::vector<T>& v) {
  return v[below(r, v.size())];
}
// 1 + a geometric count: mostly one or two, sometimes many.
int op_count(Rng& r, int max) {
  int n = 1;
  while (n < max && chance(r, 0.45)) ++n;
  return n;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (char& c : s) {
    c = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return s;
}

const std::vector<uint64_t>& interesting_u64() {
  static const std::vector<uint64_t> v = {0,
                                          1,
                                          2,
                                          7,
                                          8,
                                          0x7f,
                                          0x80,
                                          0xff,
                                          0x100,
                                          0xffff,
                                          0x10000,
                                          0x7fffffff,
                                          0x80000000,
                                          0xffffffff,
                                          0x100000000ULL,
                                          0x7fffffffffffffffULL,
                                          0x8000000000000000ULL,
                                          0xfffffffffffffff8ULL,
                                          0xffffffffffffffffULL};
  return v;
}

const std::vector<int64_t>& interesting_i64() {
  static const std::vector<int64_t> v = {0,
                                         1,
                                         -1,
                                         2,
                                         3,
                                         -2,
                                         255,
                                         256,
                                         50256,
                                         50260,
                                         INT32_MAX,
                                         int64_t{INT32_MAX} + 1,
                                         INT32_MIN,
                                         int64_t{INT32_MIN} - 1,
                                         int64_t{1} << 40,
                                         INT64_MAX,
                                         INT64_MAX - 1,
                                         INT64_MIN,
                                         INT64_MIN + 1};
  return v;
}

// Deep nesting to splice in: mostly around the parsers' limit (64), sometimes far beyond.
std::string deep_nesting(Rng& r) {
  size_t depth = 0;
  switch (below(r, 4)) {
    case 0: depth = 1 + below(r, 8); break;
    case 1: depth = 60 + below(r, 10); break;
    case 2: depth = 64 + below(r, 1000); break;
    default: depth = 1000 + below(r, 200000); break;
  }
  static const std::vector<std::string> opens = {"[", "{\"a\":", "[{\"a\":", "{\"\":[", " [ "};
  const std::string& open = pick(r, opens);
  std::string s;
  s.reserve(depth * open.size() * 2 + 8);
  for (size_t i = 0; i < depth; ++i) s += open;
  if (chance(r, 0.5)) {  // balanced, so that only the depth is wrong
    s += "1";
    for (size_t i = depth; i-- > 0;) {
      if (open == "[" || open == " [ ")
        s += "]";
      else if (open == "{\"a\":")
        s += "}";
      else if (open == "[{\"a\":")
        s += "}]";
      else
        s += "]}";
    }
  }
  return s;
}

const std::vector<std::string>& json_tokens() {
  static const std::vector<std::string> v = {
      "1e308",
      "-1e308",
      "1e309",
      "-1",
      "0",
      "-0",
      "1.5",
      "4.9e-324",
      "18446744073709551615",
      "18446744073709551616",
      "9223372036854775807",
      "9223372036854775808",
      "-9223372036854775808",
      "-9223372036854775809",
      "4294967296",
      "2147483648",
      "99999999999999999999999999999999",
      "1E+2",
      "0.0000001e-400",
      "null",
      "true",
      "false",
      "\"\"",
      "\"F32\"",
      "\"I8\"",
      "{}",
      "[]",
      "[-1]",
      "[1e308]",
      "[18446744073709551615,0]",
      ",",
      ":",
      "\"",
      "\\",
      "\\u0000",
      "\\ud800",
      "\\udfff\\ud800",
      "\xff",
      "\xc0\x80",
      "\xed\xa0\x80",
      "\xf4\x90\x80\x80",
      "\xe2\x82",
      "{\"a\":",
      "[[[[",
      "]]]]",
      "}}}}",
      "{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}",
      "\"shape\":[-1]",
      "\"data_offsets\":[0,18446744073709551615]",
      "\"__metadata__\":",
      "\"translation\":",
      "\"ids\":[",
      "\n",
      "\r\n",
      "\t",
      " ",
      std::string(1, '\0'),
      "Ġ",
      "<|endoftext|>"};
  return v;
}

const std::vector<std::string>& text_tokens() {
  static const std::vector<std::string> v = {" :: ",
                                             " | ",
                                             "; ",
                                             " ",
                                             "\n",
                                             "\r\n",
                                             "\r",
                                             "#",
                                             "{",
                                             "}",
                                             "[",
                                             "]",
                                             "(",
                                             ")",
                                             "<",
                                             ">",
                                             "/",
                                             "~",
                                             "{m}",
                                             "[ugs.]",
                                             "(x)",
                                             "<y>",
                                             "/Abk./",
                                             "~ref",
                                             ".",
                                             "!",
                                             "?",
                                             "\"",
                                             "\xc2\xa0",
                                             "\xff",
                                             "\xc0",
                                             "\xe2\x82",
                                             "\xed\xa0\x80",
                                             std::string(1, '\0'),
                                             "#version: 0.2",
                                             "Ġ",
                                             "Ġt",
                                             "h e",
                                             "a",
                                             "ÄÖÜß",
                                             "日本",
                                             "  ",
                                             "::",
                                             "||"};
  return v;
}

// Byte-level mutations: flips, inserts, deletes, duplicated chunks, truncation, splices of
// dictionary tokens and deep nesting, and interesting 64-bit and 32-bit integers.
void mutate_bytes(std::string& s, Rng& r, const std::vector<std::string>& dict, int n_ops) {
  static const std::vector<char> bytes = {'\0', '\x01', '\x7f', '\x80', '\xff', '"',  '\\', '{',
                                          '}',  '[',    ']',    ',',    ':',    '\n', '\r', ' ',
                                          '-',  '0',    '9',    'e',    '.',    '#',  '|',  '\xc3'};
  for (int op = 0; op < n_ops; ++op) {
    const size_t n = s.size();
    switch (below(r, 12)) {
      case 0:  // bit flip
        if (n > 0) s[below(r, n)] ^= static_cast<char>(1u << below(r, 8));
        break;
      case 1:  // random byte
        if (n > 0) s[below(r, n)] = static_cast<char>(r());
        break;
      case 2:  // interesting byte
        if (n > 0) s[below(r, n)] = pick(r, bytes);
        break;
      case 3: {  // insert random bytes
        std::string ins(1 + below(r, 8), '\0');
        for (char& c : ins) c = static_cast<char>(r());
        s.insert(below(r, n + 1), ins);
        break;
      }
      case 4:  // delete a range
        if (n > 0) {
          const size_t at = below(r, n);
          s.erase(at, 1 + below(r, std::min<size_t>(64, n - at)));
        }
        break;
      case 5:  // duplicate a chunk
        if (n > 0) {
          const size_t at = below(r, n);
          const size_t len = 1 + below(r, std::min<size_t>(4096, n - at));
          if (n + len <= kMaxInput) s.insert(below(r, n + 1), s.substr(at, len));
        }
        break;
      case 6:  // truncate
        if (n > 0) s.resize(below(r, n));
        break;
      case 7:  // splice a token in
        s.insert(below(r, n + 1), pick(r, dict));
        break;
      case 8:  // replace a range by a token
        if (n > 0) {
          const size_t at = below(r, n);
          s.replace(at, 1 + below(r, std::min<size_t>(16, n - at)), pick(r, dict));
        }
        break;
      case 9:  // deep nesting
        s.insert(below(r, n + 1), deep_nesting(r));
        break;
      case 10:  // an interesting integer, 8 or 4 bytes little-endian
        if (n >= 8) {
          uint64_t v = pick(r, interesting_u64());
          if (chance(r, 0.2)) v = n - below(r, 16);
          const std::string b = le64(v);
          const size_t width = chance(r, 0.5) ? 8 : 4;
          const size_t at = chance(r, 0.3) ? 0 : below(r, n - width + 1);
          s.replace(at, width, b.substr(0, width));
        }
        break;
      default:  // a number in the text replaced by an interesting one
        if (n > 0) {
          const size_t at = s.find_first_of("0123456789", below(r, n));
          if (at != std::string::npos) {
            const size_t end = s.find_first_not_of("0123456789.eE+-", at);
            s.replace(at, (end == std::string::npos ? n : end) - at,
                      pick(r, json_tokens()).substr(0, 24));
          }
        }
        break;
    }
    if (s.size() > kMaxInput) s.resize(kMaxInput);
  }
}

// A JSON value that parsers of the project's formats find surprising.
json interesting_json(Rng& r) {
  switch (below(r, 24)) {
    case 0: return 1e308;
    case 1: return -1;
    case 2: return std::numeric_limits<uint64_t>::max();
    case 3: return uint64_t{1} << 63;
    case 4: return std::numeric_limits<int64_t>::min();
    case 5: return pick(r, interesting_i64());
    case 6: return pick(r, interesting_u64());
    case 7: return 0.5;
    case 8: return -0.0;
    case 9: return "";
    case 10:
      return pick(r, std::vector<std::string>{"F32", "F16", "BF16", "F64", "I64", "I8", "U8",
                                              "BOOL", "F8_E4M3", "f32", "F32 "});
    case 11: return std::string(std::string("a\0b", 3));
    case 12: return std::string(1000 + below(r, 20000), 'x');
    case 13: return nullptr;
    case 14: return chance(r, 0.5);
    case 15: return json::array();
    case 16: return json::object();
    case 17: return json::array({-1});
    case 18: return json::array({pick(r, interesting_u64()), pick(r, interesting_u64())});
    case 19: return json::array({pick(r, interesting_i64()), pick(r, interesting_i64())});
    case 20: {
      json a = json::array();
      const size_t n = 1 + below(r, 12);
      for (size_t i = 0; i < n; ++i)
        a.push_back(chance(r, 0.7) ? json(below(r, 6)) : json(pick(r, interesting_i64())));
      return a;
    }
    case 21: {  // nesting around the limit (built as a value; dumping it recurses that deep)
      json v = 1;
      const size_t depth = 55 + below(r, 20);
      for (size_t i = 0; i < depth; ++i) v = chance(r, 0.5) ? json::array({v}) : json{{"a", v}};
      return v;
    }
    case 22: {
      json a = json::array();
      const size_t n = 1000 + below(r, 50000);
      for (size_t i = 0; i < n; ++i) a.push_back(i);
      return a;
    }
    default: return json{{"dtype", "F32"}, {"shape", json::array({1})}, {"data_offsets", {0, 4}}};
  }
}

void collect_nodes(json& root, std::vector<json*>& out) {
  std::vector<json*> stack{&root};
  while (!stack.empty() && out.size() < 100000) {
    json* j = stack.back();
    stack.pop_back();
    out.push_back(j);
    if (j->is_structured()) {
      for (auto& child : *j) stack.push_back(&child);
    }
  }
}

// Tree-level mutations: a value replaced, a key removed, added or renamed, an element removed or
// duplicated, a number nudged, a value wrapped.
void mutate_json(json& root, Rng& r, int n_ops) {
  for (int op = 0; op < n_ops; ++op) {
    std::vector<json*> nodes;
    collect_nodes(root, nodes);
    json& node = *nodes[below(r, nodes.size())];
    switch (below(r, 7)) {
      case 0:
      case 1: node = interesting_json(r); break;
      case 2:
        if (node.is_object() && !node.empty()) {
          auto it = node.begin();
          std::advance(it, static_cast<long>(below(r, node.size())));
          const std::string key = it.key();
          json value = *it;
          node.erase(key);
          if (chance(r, 0.5))
            node[key + pick(r, std::vector<std::string>{"x", "", " ", "_"})] = value;
          else if (chance(r, 0.3))
            node[""] = value;
        } else if (node.is_object()) {
          node["a"] = interesting_json(r);
        }
        break;
      case 3:
        if (node.is_object()) {
          static const std::vector<std::string> keys = {
              "dtype", "shape", "data_offsets", "__metadata__", "translation",
              "de",    "en",    "ids",          "vocab_size",   "n_layer",
              "x"};
          node[pick(r, keys)] = interesting_json(r);
        }
        break;
      case 4:
        if (node.is_array() && !node.empty()) {
          const size_t i = below(r, node.size());
          if (chance(r, 0.5))
            node.erase(i);
          else
            node.push_back(json(node[i]));
        } else if (node.is_array()) {
          node.push_back(interesting_json(r));
        }
        break;
      case 5:
        if (node.is_number_integer()) {
          const int64_t v = node.get<int64_t>();
          node = v == INT64_MIN ? json(v + 1) : chance(r, 0.5) ? json(v - 1) : json(-v);
        } else if (node.is_number_unsigned()) {
          node = node.get<uint64_t>() + (chance(r, 0.5) ? 1 : uint64_t{1} << 32);
        } else {
          node = interesting_json(r);
        }
        break;
      default: node = chance(r, 0.5) ? json::array({node}) : json{{"a", node}}; break;
    }
  }
}

std::string dump_json(const json& j, Rng& r) {
  return j.dump(chance(r, 0.2) ? 2 : -1, ' ', chance(r, 0.1), json::error_handler_t::replace);
}

// ================================================================================================
// Seeds: valid inputs built here
// ================================================================================================

json seed_config() {
  return json::parse(R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024,
    "n_embd": 768, "n_head": 12, "n_inner": null, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "scale_attn_weights": true, "summary_activation": null,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
    "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true,
    "max_length": 50}}, "torch_dtype": "float32", "vocab_size": 50257})");
}

json seed_meta() {
  return json::parse(R"({"format": "gpt2p-checkpoint-v2", "step": 1200, "epoch": 3,
    "batch_in_epoch": 17, "seed": 42, "model_config": {"vocab_size": 50260, "n_ctx": 128,
    "n_embd": 64, "n_layer": 2, "n_head": 2, "dropout": 0.1}, "layer_range": {"begin": 0,
    "end": 2}, "files": {"weights.safetensors": {"bytes": 123456, "crc32": "0a1b2c3d"},
    "optimizer.safetensors": {"bytes": 246912, "crc32": "ffffffff"}},
    "rng_state": [1, 2, 3, 18446744073709551615], "rank_rng_states": [[1, 2], [3, 4]],
    "tokenizer_identity": "gpt2-bpe:0123456789abcdef"})");
}

// A small byte-level BPE vocabulary: the 256 byte characters, a few merges, <|endoftext|>.
const std::vector<std::pair<std::string, std::string>>& seed_merges() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"},   {"Ġ", "a"}, {"e", "r"},
      {"l", "l"}, {"o", "r"}, {"Ġ", "w"},   {"Ġw", "or"}, {"H", "e"}, {"He", "ll"}};
  return m;
}

json seed_encoder() {
  json enc = json::object();
  int32_t id = 0;
  for (int b = 0; b < 256; ++b)
    enc[gpt2p::data::bytes_to_token(std::string(1, static_cast<char>(b)))] = id++;
  for (const auto& [a, b] : seed_merges()) enc[a + b] = id++;
  enc["<|endoftext|>"] = id++;
  return enc;
}

std::string seed_merges_text() {
  std::string s = "#version: 0.2\n";
  for (const auto& [a, b] : seed_merges()) s += a + " " + b + "\n";
  return s;
}

// A safetensors file: random tensors with consistent offsets, the header sometimes mutated as a
// tree before it is written, the length prefix sometimes wrong.
std::string make_safetensors(Rng& r) {
  static const std::vector<std::pair<std::string, size_t>> dtypes = {
      {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8}};
  json header = json::object();
  if (chance(r, 0.6)) header["__metadata__"] = {{"format", "pt"}, {"note", "fuzz seed"}};
  uint64_t offset = 0;
  const size_t n = below(r, 5);
  for (size_t i = 0; i < n; ++i) {
    const auto& [dtype, size] = pick(r, dtypes);
    json shape = json::array();
    uint64_t numel = 1;
    const size_t rank = below(r, 4);
    for (size_t d = 0; d < rank; ++d) {
      const uint64_t s = below(r, 5);
      shape.push_back(s);
      numel *= s;
    }
    const uint64_t nbytes = numel * size;
    header["t" + std::to_string(i) + ".weight"] = {
        {"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  if (chance(r, 0.5)) mutate_json(header, r, op_count(r, 4));
  std::string text = dump_json(header, r);
  if (chance(r, 0.5)) text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t len = text.size();
  if (chance(r, 0.1)) {
    len = chance(r, 0.5) ? pick(r, interesting_u64()) : len + below(r, 17) - 8;
  }
  std::string data(offset + (chance(r, 0.2) ? below(r, 16) : 0), '\0');
  for (char& c : data) c = static_cast<char>(r());
  if (chance(r, 0.1) && !data.empty()) data.resize(below(r, data.size()));
  std::string file = le64(len) + text + data;
  if (chance(r, 0.3)) mutate_bytes(file, r, json_tokens(), op_count(r, 8));
  return file;
}

std::string make_jsonl_lines(Rng& r, bool ids) {
  std::vector<json> rows;
  if (ids) {
    rows = {json{{"ids", {15496, 995}}}, json{{"ids", {1, 2, 3, 50256}}},
            json{{"ids", json::array()}}};
  } else {
    rows = {json{{"translation", {{"de", "Hallo Welt."}, {"en", "Hello world."}}}},
            json{{"translation", {{"de", "Guten\u00a0Morgen "}, {"en", " Good\tmorning"}}}},
            json{{"translation", {{"de", "Größe ändern?"}, {"en", "Resize?"}}}},
            json{{"translation", {{"de", ""}, {"en", "empty German"}}}}};
  }
  std::string out;
  const size_t n = 1 + below(r, 6);
  for (size_t i = 0; i < n; ++i) {
    json row = pick(r, rows);
    if (chance(r, 0.3)) mutate_json(row, r, op_count(r, 3));
    out += dump_json(row, r);
    out += chance(r, 0.1) ? "\r\n" : "\n";
    if (chance(r, 0.1)) out += chance(r, 0.5) ? "\n" : "   \t\n";
  }
  return out;
}

const char* const kDingSeed =
    "# Version :: 1.8.1 2016-09-06\n"
    "# Copyright (c) :: Frank Richter <frank.richter@hrz.tu-chemnitz.de> 1995-2016\n"
    "Aal {m} [zool.] | Aale {pl} :: eel | eels\n"
    "Das ist ein Haus. :: This is a house.\n"
    "Er kommt morgen (vielleicht) wieder. :: He will (maybe) come back tomorrow.\n"
    "Abk. /Abk./; Abkürzung {f} :: abbr.; abbreviation\n"
    "Prozesskostenhilfe {f} ~Armenrecht :: legal aid ~in forma pauperis\n"
    "Haus {n}; Gebäude {n} | Häuser {pl} :: house; building | houses\n"
    "Ein-/Ausgabe {f} <E/A> :: input/output <I/O>\n"
    "Sie sagte: \"Komm {{her}}!\" :: She said: \"Come here!\"\r\n"
    "ohne Trenner\n";

const char* const kParallelDe = "Guten Morgen.\nDas ist gut.\n\nHallo\u00a0Welt\r\nJa\n";
const char* const kParallelEn = "Good morning.\nThat is good.\n\nHello world\r\nYes\n";

Split sample_split(int which) {
  Split s;
  if (which == 0) {
    s.add({1, 2, 3}, {4, 5}, "Hallo Welt.", "Hello world.");
    s.add({6}, {7, 8, 9}, "Größe ändern?", "Resize?");
    s.add({}, {10}, "", "x");
  } else if (which == 1) {
    s.add({11, 12}, {13}, "Ja.", "Yes.");
  }
  return s;
}

DatasetMeta sample_meta() {
  DatasetMeta m;
  m.tokenizer_identity = "gpt2-bpe:0123456789abcdef";
  m.vocab_size = 50260;
  m.source = "fuzz seed";
  m.created = "2024-01-01T00:00:00Z";
  return m;
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw HarnessError("cannot read " + path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_whole(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw HarnessError("cannot write " + path);
}

// ---- HDF5 files with every part the reader looks at sometimes missing, mistyped or misshapen ----

const H5::StrType& vlen_str() {
  static const H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  return t;
}

// An attribute as the reader expects it (scalar string or int64), or: missing, of the other
// kind, a float, a null or 3-element dataspace, a fixed-length string.
void put_attr(H5::H5Object& obj, const char* name, bool is_string, const std::string& text,
              int64_t value, Rng& r) {
  const uint64_t k = chance(r, 0.75) ? 99 : below(r, 7);
  if (k == 0) return;
  H5::DataSpace space(H5S_SCALAR);
  hsize_t three = 3;
  size_t count = 1;
  if (k == 1) {
    space = H5::DataSpace(H5S_NULL);
    count = 0;
  } else if (k == 2) {
    space = H5::DataSpace(1, &three);
    count = 3;
  }
  const bool as_string = k == 3 ? !is_string : is_string;
  if (k == 4) {
    H5::Attribute a = obj.createAttribute(name, H5::PredType::IEEE_F64LE, space);
    const double d[3] = {1e308, -1.0, 0.5};
    if (count > 0) a.write(H5::PredType::NATIVE_DOUBLE, d);
  } else if (as_string && k == 5) {
    const H5::StrType fixed(H5::PredType::C_S1, std::max<size_t>(1, text.size()));
    H5::Attribute a = obj.createAttribute(name, fixed, space);
    std::string buf = text;
    buf.resize(std::max<size_t>(1, text.size()) * 3, '\0');
    if (count > 0) a.write(fixed, buf.data());
  } else if (as_string) {
    H5::Attribute a = obj.createAttribute(name, vlen_str(), space);
    const char* p[3] = {text.c_str(), text.c_str(), chance(r, 0.5) ? nullptr : ""};
    if (count > 0) a.write(vlen_str(), p);
  } else {
    H5::Attribute a = obj.createAttribute(name, H5::PredType::STD_I64LE, space);
    const int64_t v[3] = {value, value, value};
    if (count > 0) a.write(H5::PredType::NATIVE_INT64, v);
  }
}

void put_ints(H5::Group& g, const char* name, const std::vector<int64_t>& v, bool narrow, Rng& r) {
  const uint64_t k = chance(r, 0.8) ? 99 : below(r, 7);
  if (k == 0) return;
  hsize_t dims[2] = {v.size(), 1};
  H5::DataSpace space = k == 1   ? H5::DataSpace(H5S_SCALAR)
                        : k == 2 ? H5::DataSpace(H5S_NULL)
                        : k == 3 ? H5::DataSpace(2, dims)
                                 : H5::DataSpace(1, dims);
  if (k == 4) {  // strings where numbers belong
    H5::DataSet ds = g.createDataSet(name, vlen_str(), space);
    std::vector<const char*> p(v.size(), "12");
    if (!v.empty()) ds.write(p.data(), vlen_str());
    return;
  }
  const H5::PredType& file_type = k == 5   ? H5::PredType::IEEE_F64LE
                                  : k == 6 ? H5::PredType::STD_U64LE
                                  : narrow ? H5::PredType::STD_I32LE
                                           : H5::PredType::STD_I64LE;
  H5::DataSet ds = g.createDataSet(name, file_type, space);
  if (k == 1) {
    const int64_t one = v.empty() ? 7 : v[0];
    ds.write(&one, H5::PredType::NATIVE_INT64);
  } else if (k != 2 && !v.empty()) {
    ds.write(v.data(), H5::PredType::NATIVE_INT64);
  }
}

void put_strings(H5::Group& g, const char* name, const std::vector<std::string>& v, Rng& r) {
  const uint64_t k = chance(r, 0.8) ? 99 : below(r, 5);
  if (k == 0) return;
  hsize_t dims[2] = {v.size(), 1};
  if (k == 1) {  // numbers where strings belong
    H5::DataSet ds = g.createDataSet(name, H5::PredType::STD_I32LE, H5::DataSpace(1, dims));
    std::vector<int32_t> x(v.size(), 5);
    if (!v.empty()) ds.write(x.data(), H5::PredType::NATIVE_INT32);
    return;
  }
  if (k == 2) {  // fixed-length strings
    const H5::StrType fixed(H5::PredType::C_S1, 8);
    H5::DataSet ds = g.createDataSet(name, fixed, H5::DataSpace(1, dims));
    std::string buf(v.size() * 8, 'a');
    if (!v.empty()) ds.write(buf.data(), fixed);
    return;
  }
  H5::DataSet ds =
      g.createDataSet(name, vlen_str(), k == 3 ? H5::DataSpace(2, dims) : H5::DataSpace(1, dims));
  std::vector<const char*> p;
  for (const auto& s : v) p.push_back(s.c_str());
  if (k == 4 && !p.empty()) p[below(r, p.size())] = nullptr;
  if (!p.empty()) ds.write(p.data(), vlen_str());
}

void make_h5_variant(const std::string& path, Rng& r) {
  H5::FileCreatPropList with_block;  // the layout of a dataset file: a user block, then HDF5
  with_block.setUserblock(gpt2p::data::kDatasetUserBlock);
  H5::H5File file(path, H5F_ACC_TRUNC, with_block);
  auto maybe = [&](int64_t v) { return chance(r, 0.1) ? pick(r, interesting_i64()) : v; };
  put_attr(file, "format", true,
           chance(r, 0.95) ? gpt2p::data::kDatasetFormat : "gpt2p-translation-v0", 0, r);
  put_attr(file, "tokenizer_identity", true, "gpt2-bpe:0123456789abcdef", 0, r);
  put_attr(file, "vocab_size", false, "", maybe(50260), r);
  put_attr(file, "eos_de_id", false, "", maybe(50257), r);
  put_attr(file, "eos_en_id", false, "", maybe(50258), r);
  put_attr(file, "pad_id", false, "", maybe(50259), r);
  put_attr(file, "source", true,
           chance(r, 0.2) ? std::string("fuzz \xff\xfe\0variant", 15) : std::string("fuzz variant"),
           0, r);
  put_attr(file, "created", true, "2024-01-01T00:00:00Z", 0, r);
  for (const auto& name : gpt2p::data::split_names()) {
    const uint64_t k = chance(r, 0.9) ? 99 : below(r, 2);
    if (k == 0) continue;  // missing split
    if (k == 1) {          // a dataset where the group belongs
      const hsize_t one = 1;
      H5::DataSet ds = file.createDataSet(name, H5::PredType::STD_I32LE, H5::DataSpace(1, &one));
      const int32_t x = 0;
      ds.write(&x, H5::PredType::NATIVE_INT32);
      continue;
    }
    put_attr(file, ("n_" + name).c_str(), false, "", 0, r);
    H5::Group g = file.createGroup("/" + name);
    std::vector<int64_t> tokens, offsets{0}, src_lengths;
    std::vector<std::string> de, en;
    const size_t n = below(r, 5);
    for (size_t i = 0; i < n; ++i) {
      const size_t src = below(r, 4), tgt = below(r, 4);
      for (size_t t = 0; t < src + tgt; ++t)
        tokens.push_back(static_cast<int64_t>(below(r, 50260)));
      offsets.push_back(static_cast<int64_t>(tokens.size()));
      src_lengths.push_back(static_cast<int64_t>(src));
      de.push_back("de " + std::to_string(i));
      en.push_back("en " + std::to_string(i));
    }
    const int bends = chance(r, 0.5) ? 0 : op_count(r, 4);
    for (int b = 0; b < bends; ++b) {
      std::vector<int64_t>* const arrays[3] = {&tokens, &offsets, &src_lengths};
      std::vector<int64_t>& v = *arrays[below(r, 3)];
      switch (below(r, 5)) {
        case 0:
          if (!v.empty()) v[below(r, v.size())] = pick(r, interesting_i64());
          break;
        case 1:
          if (!v.empty()) {  // wrapping, as the file's bytes would
            int64_t& x = v[below(r, v.size())];
            x = static_cast<int64_t>(static_cast<uint64_t>(x) +
                                     (chance(r, 0.5) ? 1 : ~uint64_t{0}));
          }
          break;
        case 2:
          if (!v.empty()) v.erase(v.begin() + static_cast<long>(below(r, v.size())));
          break;
        case 3: v.push_back(pick(r, interesting_i64())); break;
        default:  // an inner offset near the top of int64 before a source of a few tokens
          if (offsets.size() >= 3 && src_lengths.size() + 1 >= offsets.size()) {
            const size_t i = 1 + below(r, offsets.size() - 2);
            offsets[i] = INT64_MAX - static_cast<int64_t>(below(r, 3));
            src_lengths[i] = 1 + static_cast<int64_t>(below(r, 3));
          }
          break;
      }
    }
    if (chance(r, 0.05) && !de.empty()) de.pop_back();
    put_ints(g, "tokens", tokens, true, r);
    put_ints(g, "offsets", offsets, false, r);
    put_ints(g, "src_lengths", src_lengths, true, r);
    put_strings(g, "text_de", de, r);
    put_strings(g, "text_en", en, r);
  }
}

// ================================================================================================
// The parsers under test
// ================================================================================================

enum class Outcome { kRejected, kAccepted };

struct Target {
  const char* name;
  // Builds the input of one iteration from `r` alone.
  std::function<Input(Rng&, uint64_t iteration)> make;
  // Runs the parser; throws gpt2p::Error to reject, anything else is a finding.
  std::function<Outcome(const Input&, uint64_t iteration)> run;
  // How often it is chosen, relative to the others: an HDF5 iteration (a file written by HDF5, a
  // child process) takes some 50 times as long as a JSON one, so it is chosen less often.
  unsigned weight = 8;
};

// Runs a step of the fuzzer's own (making files, links, FIFOs): its failure is not a finding.
template <class F>
auto harness(F&& step) -> decltype(step()) {
  try {
    return step();
  } catch (const HarnessError&) {
    throw;
  } catch (const std::exception& e) {
    throw HarnessError(e.what());
  }
}

void cleanup(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

std::string g_tmp;  // this process's temporary directory

const std::string& file_bytes(const Input& in, const char* name) {
  for (const auto& f : in.files) {
    if (f.name == name) return f.bytes;
  }
  throw HarnessError(std::string("input has no file ") + name);
}

// Writes the input's files into a fresh directory (one per iteration: HDF5 keeps files open by
// inode, and a file a parser left open must not be seen again).
std::string materialise(const Input& in, uint64_t iteration) {
  return harness([&] {
    const std::string dir = g_tmp + "/it" + std::to_string(iteration);
    cleanup(dir);
    fs::create_directories(dir);
    for (const auto& f : in.files) write_whole(dir + "/" + f.name, f.bytes);
    return dir;
  });
}

void check(bool ok, const std::string& what) {
  if (!ok) throw Violation(what);
}

// ---- JSON -------------------------------------------------------------------------------------

std::string make_json_text(Rng& r) {
  json j;
  switch (below(r, 7)) {
    case 0: j = seed_config(); break;
    case 1: j = seed_meta(); break;
    case 2: j = seed_encoder(); break;
    case 3: {
      const std::string st = make_safetensors(r);
      if (st.size() < 8) return st;
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i)
        n = (n << 8) | static_cast<unsigned char>(st[static_cast<size_t>(i)]);
      return st.substr(8, std::min<uint64_t>(n, st.size() - 8));
    }
    case 4: return make_jsonl_lines(r, chance(r, 0.5));
    case 5: j = json::array({1, "two", 3.0, nullptr, true, json::object()}); break;
    default: j = json{{"a", {{"b", {{"c", json::array({1, 2, {{"d", "e"}}})}}}}}}; break;
  }
  if (chance(r, 0.5)) mutate_json(j, r, op_count(r, 4));
  std::string text = dump_json(j, r);
  if (chance(r, 0.7)) mutate_bytes(text, r, json_tokens(), op_count(r, 8));
  return text;
}

size_t json_limit(uint64_t knob) {
  switch (knob % 4) {
    case 0: return 64;
    case 1: return 4096;
    default: return gpt2p::io::kJsonMaxBytes;
  }
}

// What callers do with a parsed value: copy it, compare it, print it, walk it.
void use_json(const json& v) {
  const json copy = v;
  check(copy == v, "a parsed JSON value differs from its copy");
  const std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  (void)gpt2p::io::json_type_name(v);
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) (void)gpt2p::io::json_type_name(x);
  }
  // Printing and parsing again must agree (no depth or size limit is crossed on the way back).
  const json again = gpt2p::io::parse_json(text, "dump", "", gpt2p::io::kJsonMaxBytes);
  (void)again;
}

Target json_target() {
  return {"json",
          [](Rng& r, uint64_t) {
            Input in;
            in.knob = r();
            in.files.push_back({"input.json", make_json_text(r)});
            return in;
          },
          [](const Input& in, uint64_t) {
            json v;
            try {
              v = gpt2p::io::parse_json(file_bytes(in, "input.json"), "fuzz input", "fix the input",
                                        json_limit(in.knob));
            } catch (const gpt2p::Error&) {
              return Outcome::kRejected;
            }
            use_json(v);
            return Outcome::kAccepted;
          }};
}

Target json_file_target() {
  return {"json_file",
          [](Rng& r, uint64_t) {
            Input in;
            in.knob = r();
            in.files.push_back({"input.json", make_json_text(r)});
            return in;
          },
          [](const Input& in, uint64_t iteration) {
            const std::string dir = materialise(in, iteration);
            std::string path = dir + "/input.json";
            // Sometimes not a regular file: a directory, /dev/zero behind a link, a FIFO, nothing.
            harness([&] {
              switch ((in.knob >> 8) % 16) {
                case 0: path = dir; break;
                case 1:
                  fs::create_symlink("/dev/zero", dir + "/zero.json");
                  path = dir + "/zero.json";
                  break;
                case 2:
                  if (::mkfifo((dir + "/fifo.json").c_str(), 0644) != 0)
                    throw HarnessError("mkfifo");
                  path = dir + "/fifo.json";
                  break;
                case 3: path = dir + "/missing.json"; break;
                default: break;
              }
            });
            json v;
            try {
              v = gpt2p::io::read_json_file(path, "fix the file", json_limit(in.knob));
            } catch (const gpt2p::Error&) {
              cleanup(dir);
              return Outcome::kRejected;
            }
            cleanup(dir);
            use_json(v);
            return Outcome::kAccepted;
          }};
}

// ---- safetensors -------------------------------------------------------------------------------

Target safetensors_target() {
  return {"safetensors",
          [](Rng& r, uint64_t) {
            Input in;
            in.files.push_back({"model.safetensors", make_safetensors(r)});
            return in;
          },
          [](const Input& in, uint64_t) {
            const std::string& bytes = file_bytes(in, "model.safetensors");
            // A copy of exactly the file's size, so that ASan sees any read past its end.
            const std::vector<char> file(bytes.begin(), bytes.end());
            gpt2p::io::SafetensorsHeader h;
            try {
              h = gpt2p::io::parse_safetensors_header(file.data(), file.size(), "fuzz.safetensors");
            } catch (const gpt2p::Error&) {
              return Outcome::kRejected;
            }
            check(h.data_offset >= 8 && h.data_offset <= file.size() &&
                      h.data_offset + h.data_size == file.size(),
                  "data section [" + std::to_string(h.data_offset) + ", +" +
                      std::to_string(h.data_size) + ") is not the rest of a file of " +
                      std::to_string(file.size()) + " bytes");
            for (const auto& e : h.entries) {
              const size_t element = gpt2p::io::safetensors_element_size(e.dtype, "x", e.name);
              check(e.shape.size() <= 8, "tensor '" + e.name + "' has more than 8 dimensions");
              unsigned __int128 nbytes = element;
              for (const int64_t d : e.shape) {
                check(d >= 0, "tensor '" + e.name + "' has a negative size");
                nbytes *= static_cast<uint64_t>(d);
                check(nbytes <= std::numeric_limits<uint64_t>::max(),
                      "tensor '" + e.name + "' has more bytes than 64 bits count");
              }
              check(e.begin <= e.end && e.end <= h.data_size && e.end - e.begin == nbytes,
                    "tensor '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                        std::to_string(e.end) +
                        ") does not hold its bytes inside the data section");
              // What model/safetensors.cpp then does: allocate and copy.
              std::vector<char> tensor(e.end - e.begin);
              if (!tensor.empty()) {
                std::memcpy(tensor.data(), file.data() + h.data_offset + e.begin, tensor.size());
              }
            }
            return Outcome::kAccepted;
          }};
}

// ---- GPT-2 vocabulary --------------------------------------------------------------------------

Target bpe_target() {
  return {"bpe",
          [](Rng& r, uint64_t) {
            Input in;
            in.knob = r();
            const bool hf = chance(r, 0.5);
            json enc = seed_encoder();
            if (chance(r, 0.4)) mutate_json(enc, r, op_count(r, 4));
            std::string vocab = dump_json(enc, r);
            std::string merges = seed_merges_text();
            if (chance(r, 0.4)) mutate_bytes(merges, r, text_tokens(), op_count(r, 6));
            if (chance(r, 0.4)) mutate_bytes(vocab, r, json_tokens(), op_count(r, 6));
            if (chance(r, 0.03)) merges.clear();
            in.files.push_back({hf ? "vocab.json" : "encoder.json", vocab});
            // Sometimes only one file of the pair.
            if (!chance(r, 0.03)) in.files.push_back({hf ? "merges.txt" : "vocab.bpe", merges});
            return in;
          },
          [](const Input& in, uint64_t iteration) {
            const std::string dir = materialise(in, iteration);
            std::optional<BpeTokenizer> tok;
            try {
              tok.emplace(BpeTokenizer::from_dir(dir));
            } catch (const gpt2p::Error&) {
              cleanup(dir);
              return Outcome::kRejected;
            }
            cleanup(dir);
            // Use it: text that is valid UTF-8 decodes back to itself.
            static const std::vector<std::string> texts = {"Hello world",
                                                           " the weather in Hell",
                                                           "ÄÖÜ ß 日本語 🙂",
                                                           "  \n\t x",
                                                           "",
                                                           "Ġthe <|endoftext|> end",
                                                           "123 456'll 've"};
            for (const auto& t : texts) {
              try {
                const auto ids = tok->encode(t);
                check(tok->decode(ids) == t, "decode(encode(\"" + t + "\")) differs from the text");
                (void)tok->encode_with_specials(t);
              } catch (const gpt2p::Error&) {
                // The merges may name tokens the vocabulary lacks: a clear error is the right
                // answer.
              }
            }
            try {
              (void)tok->decode({0, 1, tok->vocab_size() - 1});
              (void)tok->add_special_token("<pad>");
              (void)tok->token_id("<pad>");
              (void)tok->identity();
              (void)tok->decode({-1});
            } catch (const gpt2p::Error&) {
            }
            const std::string& raw = in.files[0].bytes;  // arbitrary bytes as text
            try {
              (void)tok->encode(raw.substr(0, 256));
            } catch (const gpt2p::Error&) {
            }
            return Outcome::kAccepted;
          }};
}

// ---- corpora -----------------------------------------------------------------------------------

Target jsonl_target() {
  return {"jsonl",
          [](Rng& r, uint64_t) {
            Input in;
            std::string text = make_jsonl_lines(r, chance(r, 0.1));
            if (chance(r, 0.6)) mutate_bytes(text, r, json_tokens(), op_count(r, 8));
            in.files.push_back({"rows.jsonl", text});
            return in;
          },
          [](const Input& in, uint64_t iteration) {
            const std::string dir = materialise(in, iteration);
            std::vector<gpt2p::data::SentencePair> pairs;
            try {
              pairs = gpt2p::data::read_jsonl(dir + "/rows.jsonl");
            } catch (const gpt2p::Error&) {
              cleanup(dir);
              return Outcome::kRejected;
            }
            cleanup(dir);
            for (const auto& p : pairs) {
              check(!p.de.empty() && !p.en.empty(), "read_jsonl kept a pair with an empty side");
              check(gpt2p::data::normalize_whitespace(p.de) == p.de,
                    "read_jsonl kept text that is not whitespace-normalised");
            }
            (void)gpt2p::data::dedupe(pairs);
            return Outcome::kAccepted;
          }};
}

Target parallel_target() {
  return {"parallel",
          [](Rng& r, uint64_t) {
            Input in;
            std::string de = kParallelDe, en = kParallelEn;
            if (chance(r, 0.8)) mutate_bytes(de, r, text_tokens(), op_count(r, 6));
            if (chance(r, 0.5)) mutate_bytes(en, r, text_tokens(), op_count(r, 6));
            in.files.push_back({"de.txt", de});
            in.files.push_back({"en.txt", en});
            return in;
          },
          [](const Input& in, uint64_t iteration) {
            const std::string dir = materialise(in, iteration);
            std::vector<gpt2p::data::SentencePair> pairs;
            try {
              pairs = gpt2p::data::read_parallel(dir + "/de.txt", dir + "/en.txt");
            } catch (const gpt2p::Error&) {
              cleanup(dir);
              return Outcome::kRejected;
            }
            cleanup(dir);
            for (const auto& p : pairs) {
              check(!p.de.empty() && !p.en.empty(), "read_parallel kept a pair with an empty side");
            }
            const auto split = gpt2p::data::split_by_hash(pairs, {});
            (void)split;
            return Outcome::kAccepted;
          }};
}

Target ding_target() {
  return {"ding",
          [](Rng& r, uint64_t) {
            Input in;
            in.knob = r();
            std::string text = kDingSeed;
            if (chance(r, 0.9)) mutate_bytes(text, r, text_tokens(), op_count(r, 10));
            in.files.push_back({"de-en", text});
            return in;
          },
          [](const Input& in, uint64_t iteration) {
            const std::string dir = materialise(in, iteration);
            gpt2p::data::DingOptions options;
            options.include_words = (in.knob & 1) != 0;
            options.max_chars = static_cast<size_t>((in.knob >> 1) % 400);
            gpt2p::data::DingStats stats;
            std::vector<gpt2p::data::SentencePair> pairs;
            try {
              pairs = gpt2p::data::read_ding(dir + "/de-en", options, &stats);
            } catch (const gpt2p::Error&) {
              cleanup(dir);
              return Outcome::kRejected;
            }
            cleanup(dir);
            check(stats.pairs == static_cast<int64_t>(pairs.size()),
                  "read_ding's stats count another number of pairs");
            for (const auto& p : pairs) {
              check(!p.de.empty() && !p.en.empty(), "read_ding kept a pair with an empty side");
              check(p.de.size() <= options.max_chars && p.en.size() <= options.max_chars,
                    "read_ding kept a side longer than max_chars");
            }
            return Outcome::kAccepted;
          }};
}

// ---- dataset files -----------------------------------------------------------------------------

std::string g_h5_seed;  // a valid dataset file written by data::write_dataset_file

Target hdf5_target() {
  return {"hdf5",
          [](Rng& r, uint64_t iteration) {
            Input in;
            std::string bytes;
            // knob bit 0: the bytes were changed after HDF5 wrote them (a corrupt file).
            // knob bit 1: then sealed with a valid checksum block, and read by from_image.
            if (chance(r, 0.5)) {
              in.knob = 1;
              bytes = g_h5_seed;
              // Byte flips of the file, and now and then an interesting integer (an address, a
              // size) or a truncation.
              const int flips = op_count(r, 16);
              for (int f = 0; f < flips && !bytes.empty(); ++f) {
                if (chance(r, 0.8)) {
                  bytes[below(r, bytes.size())] ^= static_cast<char>(1u << below(r, 8));
                } else {
                  mutate_bytes(bytes, r, json_tokens(), 1);
                }
              }
            } else {
              const std::string path = g_tmp + "/gen" + std::to_string(iteration) + ".h5";
              try {
                make_h5_variant(path, r);
              } catch (const H5::Exception& e) {
                throw HarnessError("writing an HDF5 variant failed: " + e.getDetailMsg());
              }
              bytes = read_whole(path);
              fs::remove(path);
              if (chance(r, 0.2)) {
                in.knob = 1;
                const int flips = op_count(r, 8);
                for (int f = 0; f < flips && !bytes.empty(); ++f) {
                  bytes[below(r, bytes.size())] ^= static_cast<char>(1u << below(r, 8));
                }
              }
            }
            if (bytes.size() > gpt2p::data::kDatasetUserBlock && chance(r, 0.85)) {
              gpt2p::data::seal_dataset_image(bytes);
              in.knob |= 2;
            }
            in.files.push_back({"data.h5", bytes});
            return in;
          },
          [](const Input& in, uint64_t iteration) {
            const std::string dir = materialise(in, iteration);
            std::optional<DatasetFile> d;
            try {
              const std::string path = dir + "/data.h5";
              if ((in.knob & 2) != 0) {
                d.emplace(DatasetFile::from_image(read_whole(path), path));
              } else {
                d.emplace(DatasetFile::open(path));
              }
            } catch (const gpt2p::Error&) {
              cleanup(dir);
              return Outcome::kRejected;
            }
            cleanup(dir);
            // What training does with it: every example's source and target, every token id.
            const int32_t vocab = d->meta().vocab_size;
            for (const auto& name : gpt2p::data::split_names()) {
              const Split& s = d->split(name);
              for (int64_t i = 0; i < s.size(); ++i) {
                const auto src = s.src(i);
                const auto tgt = s.tgt(i);
                check(tgt.size() <= s.tokens().size() && src.size() <= s.tokens().size(),
                      name + " example " + std::to_string(i) + " has more tokens than the split");
                for (const int32_t id : src)
                  check(id >= 0 && id < vocab, "source id outside the vocabulary");
                for (const int32_t id : tgt)
                  check(id >= 0 && id < vocab, "target id outside the vocabulary");
                (void)s.text_de(i).size();
                (void)s.text_en(i).size();
              }
              check(s.src_tokens() + s.tgt_tokens() == static_cast<int64_t>(s.tokens().size()),
                    name + ": source and target tokens do not add up");
            }
            try {
              d->require_tokenizer("gpt2-bpe:0123456789abcdef", 50260);
            } catch (const gpt2p::Error&) {
            }
            return Outcome::kAccepted;
          },
          1};
}

// ================================================================================================
// The driver
// ================================================================================================

struct RunResult {
  enum Kind { kRejected, kAccepted, kFinding, kThirdParty } kind = kRejected;
  std::string problem;
};

std::string too_large_allocation(const Input& input) {
  size_t input_bytes = 0;
  for (const auto& f : input.files) input_bytes += f.bytes.size();
  return "one allocation of " + std::to_string(g_largest_alloc.load()) +
         " bytes (more than --max-alloc-mb) for an input of " + std::to_string(input_bytes) +
         " bytes";
}

// Runs the parser here; a sanitizer error or a hang ends this process (after saving the input).
RunResult run_in_process(const Target& target, const Input& input, uint64_t iteration,
                         unsigned timeout) {
  RunResult res;
  g_largest_alloc = 0;
  g_alloc_reported = false;
  ::alarm(timeout);
  try {
    res.kind = target.run(input, iteration) == Outcome::kAccepted ? RunResult::kAccepted
                                                                  : RunResult::kRejected;
  } catch (const Violation& v) {
    res = {RunResult::kFinding,
           std::string("accepted an input that breaks an invariant: ") + v.what()};
  } catch (const HarnessError&) {
    ::alarm(0);
    throw;
  } catch (const std::exception& e) {
    res = {RunResult::kFinding,
           current_exception_type() + " escaped (not gpt2p::Error): " + e.what()};
  } catch (...) {
    res = {RunResult::kFinding,
           current_exception_type() + " escaped (not gpt2p::Error, not std::exception)"};
  }
  ::alarm(0);
  if (res.kind != RunResult::kFinding && g_largest_alloc.load() > g_alloc_limit) {
    res = {RunResult::kFinding, too_large_allocation(input)};
  }
  return res;
}

// Exit codes of a child that ran one input.
constexpr int kChildRejected = 20, kChildAccepted = 21, kChildFinding = 22, kChildHang = 23,
              kChildAlloc = 24;

// The first frame of a sanitizer report that is not the sanitizer's own (an interceptor, the
// allocator): where the error happened.
std::string first_own_frame(const std::string& report) {
  std::istringstream lines(report);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t hash = line.find('#');
    if (hash == std::string::npos || line.find_first_not_of(' ') != hash) continue;
    if (line.find("libsanitizer") != std::string::npos ||
        line.find("__interceptor_") != std::string::npos ||
        line.find("libasan") != std::string::npos || line.find("libubsan") != std::string::npos ||
        line.find("__sanitizer_print_stack_trace") != std::string::npos ||
        line.find("malloc_hook") != std::string::npos ||
        line.find("on_alarm") != std::string::npos || line.find("libc.so") != std::string::npos) {
      continue;
    }
    return line.substr(hash);
  }
  return "";
}

// Runs the parser in a child process, so that a crash inside a library that the project does not
// own (libhdf5 on a corrupt file) ends only that child. The child's sanitizer report is kept in
// a file, printed here and classified by where it happened.
RunResult run_in_child(const Target& target, const Input& input, uint64_t iteration,
                       unsigned timeout) {
  const std::string report = g_tmp + "/report-" + std::to_string(iteration);
  const std::string problem_file = g_tmp + "/problem-" + std::to_string(iteration);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw HarnessError(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    g_in_child_flag = true;
    // Everything the child prints (sanitizer reports included) goes to a file the parent reads.
    const int fd = ::open(report.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, 2) < 0) ::_exit(2);
    ::close(fd);
    int code = kChildRejected;
    RunResult res;
    try {
      res = run_in_process(target, input, iteration, timeout);
    } catch (const HarnessError& e) {
      std::fprintf(stderr, "fuzz_parsers: %s\n", e.what());
      ::_exit(2);
    }
    if (res.kind == RunResult::kFinding) {
      code = g_largest_alloc.load() > g_alloc_limit && res.problem.rfind("one allocation", 0) == 0
                 ? kChildAlloc
                 : kChildFinding;
      std::ofstream(problem_file) << res.problem;
    } else {
      code = res.kind == RunResult::kAccepted ? kChildAccepted : kChildRejected;
    }
    std::fflush(stderr);
    ::_exit(code);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw HarnessError(std::string("waitpid failed: ") + std::strerror(errno));
  }
  std::string text;
  if (fs::exists(report)) {
    text = read_whole(report);
    fs::remove(report);
  }
  std::string problem;
  if (fs::exists(problem_file)) {
    problem = read_whole(problem_file);
    fs::remove(problem_file);
  }
  RunResult res;
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildRejected) return res;
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildAccepted) {
    res.kind = RunResult::kAccepted;
    return res;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
    throw HarnessError("the child failed: " + text);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildFinding) {
    return {RunResult::kFinding, problem};
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildHang) {
    problem = "hang: the iteration ran past --timeout";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == kChildAlloc) {
    // problem as the child wrote it
  } else if (WIFSIGNALED(status)) {
    problem = std::string("killed by signal ") + std::to_string(WTERMSIG(status));
  } else {
    problem = "a sanitizer error (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
  }
  const std::string frame = first_own_frame(text);
  // Whose memory it was: the project's when the frame that owns the stack variable, or one of the
  // first frames that allocated the block, is the project's own code (a std::string the project
  // made shows libstdc++ first, then the project's function). A block already freed says nothing:
  // libhdf5 read through a stale or wild pointer into memory that was handed to whoever asked
  // next (a string of the harness, say).
  bool projects_memory = false;
  if (text.find("freed by thread") == std::string::npos) {
    for (const char* marker : {"is located in stack of thread", "allocated by thread"}) {
      const size_t at = text.find(marker);
      if (at == std::string::npos) continue;
      std::istringstream frames(text.substr(at));
      std::string line;
      std::getline(frames, line);  // the marker's own line
      for (int k = 0; k < 6 && std::getline(frames, line) && line.find('#') != std::string::npos;
           ++k) {
        if (line.find("libsanitizer") != std::string::npos) continue;  // ../../src/libsanitizer
        if (line.find("gpt2p::") != std::string::npos ||
            line.find("../src/") != std::string::npos ||
            line.find("../tests/") != std::string::npos) {
          projects_memory = true;
        }
      }
    }
  }
  // A corrupt file is libhdf5's to read safely (unless the memory it broke is the project's); a
  // well-formed file that HDF5 wrote itself is always the project's to read safely.
  const bool corrupted = (input.knob & 1) != 0;
  if (corrupted && frame.find("libhdf5") != std::string::npos && !projects_memory) {
    return {RunResult::kThirdParty, problem + " at " + frame};
  }
  std::fputs(text.c_str(), stderr);
  return {RunResult::kFinding, problem + (frame.empty() ? "" : " at " + frame)};
}

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(
      stderr,
      "fuzz_parsers: %s\n"
      "usage: fuzz_parsers [--seconds S] [--iterations N] [--seed S] [--iteration I]\n"
      "                    [--parsers json,json_file,safetensors,bpe,jsonl,parallel,ding,hdf5]\n"
      "                    [--findings-dir DIR] [--max-findings K] [--timeout S]\n"
      "                    [--max-alloc-mb M] [--isolate-all] [--strict-hdf5] [--verbose]\n"
      "       fuzz_parsers --replay PARSER DIR   (a saved finding's directory)\n"
      "The seed may also come from FUZZ_SEED; without either it is random (printed).\n",
      problem.c_str());
  std::exit(2);
}

uint64_t parse_u64(const std::string& flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
    usage(flag + " wants a non-negative integer, not '" + text + "'");
  }
  return v;
}

Input load_saved(const std::string& dir) {
  Input in;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    if (p.filename() == "knob") {
      in.knob = std::stoull(read_whole(p.string()));
    } else {
      in.files.push_back({p.filename().string(), read_whole(p.string())});
    }
  }
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 30;
  bool have_seconds = false;
  uint64_t max_iterations = std::numeric_limits<uint64_t>::max();
  bool have_seed = false;
  uint64_t seed = 0;
  bool one_iteration = false;
  uint64_t only_iteration = 0;
  uint64_t max_findings = 10;
  unsigned timeout = 10;
  bool verbose = false;
  bool isolate_all = false;
  bool strict_hdf5 = false;
  std::string only_parsers;
  std::string replay_parser, replay_dir;
  if (const char* env = std::getenv("FUZZ_SEED"); env != nullptr && *env != '\0') {
    seed = parse_u64("FUZZ_SEED", env);
    have_seed = true;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--seconds") {
      char* end = nullptr;
      const char* v = value();
      seconds = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(seconds > 0)) usage("--seconds wants a positive number");
      have_seconds = true;
    } else if (a == "--iterations") {
      max_iterations = parse_u64(a, value());
    } else if (a == "--seed") {
      seed = parse_u64(a, value());
      have_seed = true;
    } else if (a == "--iteration") {
      only_iteration = parse_u64(a, value());
      one_iteration = true;
    } else if (a == "--parsers") {
      only_parsers = std::string(",") + value() + ",";
    } else if (a == "--findings-dir") {
      g_findings_base = value();
    } else if (a == "--max-findings") {
      max_findings = std::max<uint64_t>(1, parse_u64(a, value()));
    } else if (a == "--timeout") {
      timeout = static_cast<unsigned>(std::max<uint64_t>(1, parse_u64(a, value())));
    } else if (a == "--max-alloc-mb") {
      g_alloc_limit = static_cast<size_t>(parse_u64(a, value())) << 20;
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "--isolate-all") {
      isolate_all = true;
    } else if (a == "--strict-hdf5") {
      strict_hdf5 = true;
    } else if (a == "--replay") {
      replay_parser = value();
      replay_dir = value();
    } else if (a == "--help" || a == "-h") {
      usage("a fuzz test of the project's parsers");
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (!have_seed)
    seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();

  H5::Exception::dontPrint();
  const char* tmp_root = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp_root != nullptr && *tmp_root != '\0' ? tmp_root : "/tmp") +
                        "/fuzz_parsers.XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::fprintf(stderr, "fuzz_parsers: cannot make a temporary directory from %s: %s\n",
                 pattern.c_str(), std::strerror(errno));
    return 2;
  }
  g_tmp = buf.data();
  std::snprintf(g_tmp_raw, sizeof g_tmp_raw, "%s", g_tmp.c_str());

  try {
    std::map<std::string, Split> splits;
    splits["train"] = sample_split(0);
    splits["validation"] = sample_split(1);
    splits["test"] = sample_split(2);
    gpt2p::data::write_dataset_file(g_tmp + "/seed.h5", sample_meta(), splits);
    g_h5_seed = read_whole(g_tmp + "/seed.h5");
    // The seeds themselves must be accepted: otherwise only the first checks are fuzzed.
    (void)DatasetFile::open(g_tmp + "/seed.h5");
    fs::remove(g_tmp + "/seed.h5");
    const json enc = seed_encoder();
    fs::create_directories(g_tmp + "/vocab");
    write_whole(g_tmp + "/vocab/encoder.json", enc.dump());
    write_whole(g_tmp + "/vocab/vocab.bpe", seed_merges_text());
    const auto tok = BpeTokenizer::from_dir(g_tmp + "/vocab");
    if (tok.decode(tok.encode("Hello world")) != "Hello world")
      throw HarnessError("seed vocabulary");
    fs::remove_all(g_tmp + "/vocab");
    write_whole(g_tmp + "/de-en", kDingSeed);
    if (gpt2p::data::read_ding(g_tmp + "/de-en", {}).empty()) throw HarnessError("Ding seed");
    fs::remove(g_tmp + "/de-en");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_parsers: cannot build the seeds: %s\n", e.what());
    return 2;
  }

  std::vector<Target> targets = {json_target(), json_file_target(), safetensors_target(),
                                 bpe_target(),  jsonl_target(),     parallel_target(),
                                 ding_target(), hdf5_target()};
  if (!only_parsers.empty()) {
    std::vector<Target> chosen;
    for (auto& t : targets) {
      if (only_parsers.find("," + std::string(t.name) + ",") != std::string::npos)
        chosen.push_back(t);
    }
    if (chosen.empty()) usage("--parsers names none of the parsers");
    targets = chosen;
  }
  if (!replay_parser.empty()) {
    targets.erase(std::remove_if(targets.begin(), targets.end(),
                                 [&](const Target& t) { return replay_parser != t.name; }),
                  targets.end());
    if (targets.empty()) usage("--replay names no parser: '" + replay_parser + "'");
  }

#if FUZZ_WITH_ASAN
  __sanitizer_set_death_callback(on_sanitizer_death);
  __sanitizer_install_malloc_and_free_hooks(malloc_hook, free_hook);
#endif
  struct sigaction sa {};
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, nullptr);

  g_seed = seed;
  g_n_counts = targets.size();
  for (size_t i = 0; i < targets.size(); ++i) g_counts[i].name = targets[i].name;
  ::clock_gettime(CLOCK_MONOTONIC, &g_start);
  uint64_t& findings = g_findings;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  // --iterations alone runs that many; with --seconds too, whichever ends first.
  const bool timed = have_seconds || max_iterations == std::numeric_limits<uint64_t>::max();
  std::ostringstream mode;
  if (!replay_parser.empty()) {
    mode << "replaying " << replay_dir;
  } else if (one_iteration) {
    mode << "iteration " << only_iteration;
  } else {
    if (max_iterations != std::numeric_limits<uint64_t>::max())
      mode << max_iterations << " iterations";
    if (timed) mode << (mode.tellp() > 0 ? " or " : "") << seconds << " s";
  }
  const std::string parsers_flag =
      only_parsers.empty() ? "" : " --parsers " + only_parsers.substr(1, only_parsers.size() - 2);
  std::printf("fuzz_parsers: seed %" PRIu64 " (replay an iteration: fuzz_parsers --seed %" PRIu64
              "%s --iteration I), %s, findings go to %s\n",
              seed, seed, parsers_flag.c_str(), mode.str().c_str(), g_findings_base.c_str());
  std::fflush(stdout);

  uint64_t iteration = one_iteration ? only_iteration : 0;
  uint64_t& done = g_done;
  int rc = 0;
  for (;; ++iteration) {
    if (!replay_parser.empty() || one_iteration) {
      if (done == 1) break;
    } else if (done >= max_iterations || (timed && elapsed() >= seconds)) {
      break;
    }
    Rng rng(splitmix64(seed ^ splitmix64(iteration)));
    unsigned total_weight = 0;
    for (const auto& t : targets) total_weight += t.weight;
    uint64_t ticket = below(rng, total_weight);
    size_t chosen = 0;
    while (ticket >= targets[chosen].weight) ticket -= targets[chosen++].weight;
    const Target& target = targets[chosen];
    Input input;
    try {
      input = replay_parser.empty() ? target.make(rng, iteration) : load_saved(replay_dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_parsers: building the input of iteration %" PRIu64 " failed: %s\n",
                   iteration, e.what());
      rc = 2;
      break;
    }
    std::snprintf(g_finding_dir, sizeof g_finding_dir, "%s/%s-seed%" PRIu64 "-iter%" PRIu64,
                  g_findings_base.c_str(), target.name, seed, iteration);
    if (!replay_parser.empty()) {
      std::snprintf(g_replay_line, sizeof g_replay_line,
                    "in parser %s on the saved input %s (replay: fuzz_parsers --replay %s %s)",
                    target.name, replay_dir.c_str(), target.name, replay_dir.c_str());
    } else {
      std::snprintf(g_replay_line, sizeof g_replay_line,
                    "in parser %s, seed %" PRIu64 " iteration %" PRIu64
                    " (replay: fuzz_parsers --seed %" PRIu64 "%s --iteration %" PRIu64 ")",
                    target.name, seed, iteration, seed, parsers_flag.c_str(), iteration);
    }
    g_current = &input;
    g_current_target = chosen;
    Counts& c = g_counts[chosen];
    ++c.runs;
    const bool isolate = isolate_all || std::string(target.name) == "hdf5";
    RunResult res;
    try {
      res = isolate ? run_in_child(target, input, iteration, timeout)
                    : run_in_process(target, input, iteration, timeout);
    } catch (const HarnessError& e) {
      std::fprintf(stderr, "fuzz_parsers: %s\n", e.what());
      rc = 2;
      break;
    }
    g_current = &input;
    switch (res.kind) {
      case RunResult::kRejected: ++c.rejected; break;
      case RunResult::kAccepted: ++c.accepted; break;
      case RunResult::kThirdParty:
        ++c.third_party;
        std::fprintf(stderr, "fuzz_parsers: libhdf5 crashed on a byte-corrupted file (%s) %s%s\n",
                     res.problem.c_str(), g_replay_line,
                     strict_hdf5 ? "" : "; not counted as a finding (--strict-hdf5 counts it)");
        if (strict_hdf5) {
          res.kind = RunResult::kFinding;
        } else if (c.third_party <= 3) {
          save_current_input();
          std::fprintf(stderr, "fuzz_parsers: input saved to %s\n", g_finding_dir);
        }
        break;
      case RunResult::kFinding: break;
    }
    if (res.kind == RunResult::kFinding) {
      ++c.findings;
      ++findings;
      report_crash_and_save(res.problem.c_str());
      if (findings >= max_findings) {
        std::fprintf(stderr, "fuzz_parsers: stopping after %" PRIu64 " findings (--max-findings)\n",
                     findings);
        ++done;
        break;
      }
    } else if (verbose) {
      std::fprintf(stderr, "iteration %" PRIu64 " %s ok\n", iteration, target.name);
    }
    g_current = nullptr;
    ++done;
  }
  g_current = nullptr;
  std::error_code ec;
  fs::remove_all(g_tmp, ec);

  print_summary();
  if (rc != 0) return rc;
  return findings == 0 ? 0 : 1;
}
