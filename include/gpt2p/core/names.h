// Enums with names (command-line values, HDF5 attributes, messages): one table per enum, so each
// spelling lives in one place. An enum opts in with a constexpr `names` function beside it, found
// by argument-dependent lookup:
//
//   enum class Precision { kFp32, kBf16 };
//   constexpr std::array<Named<Precision>, 2> names(Precision) {
//     return {{{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}};
//   }
//
//   name_of(Precision::kBf16) == "bf16";  from_name<Precision>("fp32") == Precision::kFp32;
//   choices<Precision>() == "fp32 | bf16"
//
// The command line reads them with cli::named_value (cli/options.h).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace gpt2p {

template <class E>
struct Named {
  E value;
  std::string_view name;
};

// E's name; "?" for a value outside its table (a cast from a bad integer).
template <class E>
constexpr std::string_view name_of(E value) {
  for (const auto& n : names(E{})) {
    if (n.value == value) return n.name;
  }
  return "?";
}

template <class E>
constexpr std::optional<E> from_name(std::string_view name) {
  for (const auto& n : names(E{})) {
    if (n.name == name) return n.value;
  }
  return std::nullopt;
}

// Every name of E in table order, joined by `separator`.
template <class E>
std::string choices(std::string_view separator = " | ") {
  std::string out;
  for (const auto& n : names(E{})) {
    if (!out.empty()) out += separator;
    out += n.name;
  }
  return out;
}

template <class E>
std::string name_string(E value) {
  return std::string(name_of(value));
}

}  // namespace gpt2p
