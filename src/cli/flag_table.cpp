#include "gpt2p/cli/flag_table.h"

#include <utility>

namespace gpt2p::cli {

FlagTable::Written FlagTable::flag(const char* name, bool& field, const std::string& help) {
  return Written(
      declare(name, po::bool_switch(&field), help, [&field] { return config_value(field); }));
}

void FlagTable::add_to(po::options_description& desc) const {
  for (const auto& section : sections_) desc.add(section);
}

std::string FlagTable::config_file(const std::string& comment) const {
  po::options_description desc;
  add_to(desc);
  ConfigEntries entries;
  for (const auto& r : records_) {
    if (r.written()) entries.emplace_back(r.name, r.value());
  }
  return to_config_file(entries, desc, comment);
}

FlagTable::Record& FlagTable::declare(const char* name, const po::value_semantic* semantic,
                                      const std::string& help, std::function<std::string()> value) {
  if (sections_.empty()) sections_.emplace_back();
  sections_.back().add_options()(name, semantic, help.c_str());
  return records_.emplace_back(Record{name, std::move(value), [] { return true; }});
}

}  // namespace gpt2p::cli
