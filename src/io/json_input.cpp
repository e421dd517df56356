#include "gpt2p/io/json_input.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "gpt2p/core/error.h"

namespace gpt2p::io {

nlohmann::json parse_json(std::string_view text, const std::string& source, const std::string& hint,
                          size_t max_bytes) {
  GPT2P_CHECK(text.size() <= max_bytes,
              source << ": " << text.size() << " bytes of JSON, more than the " << max_bytes
                     << " this input may have",
              hint);
  // The parser reports the depth of each object or array it starts (0: the outermost); one too
  // deep is discarded (the parser itself does not recurse) and the whole input refused below.
  bool too_deep = false;
  const nlohmann::json::parser_callback_t limit = [&](int depth,
                                                      nlohmann::json::parse_event_t event,
                                                      nlohmann::json&) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kJsonMaxDepth) {
      too_deep = true;
    }
    return !too_deep;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text.begin(), text.end(), limit);
  } catch (const nlohmann::json::exception& e) {
    GPT2P_FAIL(source << ": not valid JSON: " << e.what(), hint);
  }
  GPT2P_CHECK(!too_deep,
              source << ": JSON nested deeper than " << kJsonMaxDepth
                     << " levels; no input of this kind has more than a few",
              hint);
  return value;
}

std::string read_bounded_file(const std::string& path, const std::string& hint, size_t max_bytes) {
  struct stat st {};
  GPT2P_CHECK(::stat(path.c_str(), &st) == 0,
              "cannot open " << path << ": " << std::strerror(errno), hint);
  GPT2P_CHECK(S_ISREG(st.st_mode),
              path << " is not a regular file (a directory, device or pipe): refusing to read it",
              hint);
  GPT2P_CHECK(static_cast<uint64_t>(st.st_size) <= max_bytes,
              path << " is " << st.st_size << " bytes, more than the " << max_bytes
                   << " this input may have",
              hint);
  std::ifstream in(path, std::ios::binary);
  GPT2P_CHECK(in.good(), "cannot open " << path << ": " << std::strerror(errno), hint);
  // Never more than max_bytes, even if the file grows while it is read.
  std::string bytes;
  bytes.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    bytes.append(buf, static_cast<size_t>(in.gcount()));
    GPT2P_CHECK(bytes.size() <= max_bytes,
                path << " grew past " << max_bytes << " bytes while it was read", hint);
  }
  GPT2P_CHECK(!in.bad(), "reading " << path << " failed: " << std::strerror(errno), hint);
  return bytes;
}

nlohmann::json read_json_file(const std::string& path, const std::string& hint, size_t max_bytes) {
  return parse_json(read_bounded_file(path, hint, max_bytes), path, hint, max_bytes);
}

const char* json_type_name(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::null: return "null";
    default: return "a binary value";
  }
}

namespace {
const char* type_wanted(JsonType type) {
  switch (type) {
    case JsonType::kObject: return "an object";
    case JsonType::kArray: return "an array";
    case JsonType::kString: return "a string";
    case JsonType::kInteger: return "an integer";
    case JsonType::kNumber: return "a number";
  }
  return "a value";
}

bool has_type(const nlohmann::json& value, JsonType type) {
  switch (type) {
    case JsonType::kObject: return value.is_object();
    case JsonType::kArray: return value.is_array();
    case JsonType::kString: return value.is_string();
    case JsonType::kInteger: return value.is_number_integer();
    case JsonType::kNumber: return value.is_number();
  }
  return false;
}
}  // namespace

const nlohmann::json& json_field(const nlohmann::json& object, const std::string& key,
                                 JsonType type, const std::string& source,
                                 const std::string& hint) {
  GPT2P_CHECK(object.is_object(),
              source << " is " << json_type_name(object) << ", not a JSON object", hint);
  const auto it = object.find(key);
  GPT2P_CHECK(it != object.end(), source << " has no \"" << key << "\"", hint);
  GPT2P_CHECK(
      has_type(*it, type),
      source << ": \"" << key << "\" is " << json_type_name(*it) << ", not " << type_wanted(type),
      hint);
  return *it;
}

int64_t json_int_field(const nlohmann::json& object, const std::string& key, int64_t lo, int64_t hi,
                       const std::string& source, const std::string& hint) {
  const auto& v = json_field(object, key, JsonType::kInteger, source, hint);
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) && hi >= 0
                        : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  std::ostringstream range;
  if (hi == std::numeric_limits<int64_t>::max()) {
    range << "not >= " << lo;
  } else {
    range << "outside [" << lo << ", " << hi << "]";
  }
  GPT2P_CHECK(fits && (!v.is_number_unsigned() || lo <= static_cast<int64_t>(v.get<uint64_t>())),
              source << ": \"" << key << "\" is " << v.dump() << ", " << range.str(), hint);
  return v.get<int64_t>();
}

}  // namespace gpt2p::io
