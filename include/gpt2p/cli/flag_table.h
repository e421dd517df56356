// A program's flags declared once each, with the field each one sets: the declaration adds the
// flag to a --help section and records how a config file writes the field back, so --help, the
// parser and the config file a run writes list the same flags in the same order.
//
//   cli::FlagTable t;
//   t.section("Optimisation");
//   t.value("epochs", cfg.epochs, "passes").check({[](int n) { return n > 0; }, "a value > 0"});
//   t.value("lr", cfg.lr, "learning rate").with_default();
//   t.named("precision", cfg.precision, "fp32 | bf16");
//   t.flag("overwrite", cfg.overwrite, "replace --out's files").not_written();
//   t.add_to(desc);                  // parse with desc; the fields receive the values
//   t.config_file("PROGRAM --config FILE runs this again");  // the fields' values now
//
// Every flag is written to the config file unless its declaration says otherwise:
// written_unless(v) leaves it out while its field holds the "not given" value v, not_written()
// always (a flag about one start of a program rather than about what it runs).
#pragma once

#include <cmath>
#include <deque>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>

#include "gpt2p/cli/options.h"

namespace gpt2p::cli {

// The values a flag takes: `ok`, and the words an error names them by ("a value > 0").
template <class T>
struct Allowed {
  std::function<bool(T)> ok;
  std::string range;
};

class FlagTable {
  // One declared flag, for the config file: its value as the command line spells it, and whether
  // the file holds it now.
  struct Record {
    std::string name;
    std::function<std::string()> value;
    std::function<bool()> written;
  };

 public:
  // How a declared flag is written to the config file; by default always, with its field's value.
  class Written {
   public:
    explicit Written(Record& record) : record_(record) {}
    // Never written.
    void not_written() {
      record_.written = [] { return false; };
    }

   protected:
    Record& record_;
  };

  // A flag whose value is parsed into its field as a T.
  template <class T>
  class Flag : public Written {
   public:
    Flag(Record& record, T& field, po::typed_value<T>* semantic)
        : Written(record), field_(field), semantic_(semantic) {}
    // --help shows the field's value now as the default, and the parser sets it when the flag is
    // not given.
    Flag& with_default() {
      semantic_->default_value(field_);
      return *this;
    }
    // A value that fails `allowed.ok` (or is not finite) is a UsageError naming the flag, the
    // value and `allowed.range`. A flag that is not given is checked only if it has a default
    // (with_default): a "-1: not given" left in the field never reaches the check.
    Flag& check(Allowed<T> allowed) {
      semantic_->notifier([flag = record_.name, allowed = std::move(allowed)](const T& v) {
        bool finite = true;  // inf and nan pass many a range test (inf > 0)
        if constexpr (std::is_floating_point_v<T>) finite = std::isfinite(v);
        if (finite && allowed.ok(v)) return;
        std::ostringstream s;
        s << "--" << flag << " " << v << " is out of range: use " << allowed.range;
        throw UsageError(s.str());
      });
      return *this;
    }
    // Not written while the field holds `unset` (the value that means "not given").
    Flag& written_unless(T unset) {
      record_.written = [&field = field_, unset = std::move(unset)] { return !(field == unset); };
      return *this;
    }

   private:
    T& field_;
    po::typed_value<T>* semantic_;
  };

  // Flags declared after this go to a new --help section titled `title` (those declared before
  // the first go to an untitled one).
  void section(const std::string& title) { sections_.emplace_back(title); }

  // --name VALUE sets `field`.
  template <class T>
  Flag<T> value(const char* name, T& field, const std::string& help) {
    po::typed_value<T>* semantic = po::value(&field);
    return {declare(name, semantic, help, [&field] { return config_value(field); }), field,
            semantic};
  }

  // --name NAME sets `field` to the value of enum E with that name (cli::named_value); --help
  // shows the field's name now as the default.
  template <class E>
  Written named(const char* name, E& field, const std::string& help) {
    return Written(
        declare(name, named_value(field, name), help, [&field] { return config_value(field); }));
  }

  // --name (no value) sets `field` to true; it stays false without it.
  Written flag(const char* name, bool& field, const std::string& help);

  // Adds the sections, in the order they were declared, to `desc`.
  void add_to(po::options_description& desc) const;

  // The config file (cli::to_config_file) of the flags written now, in the order they were
  // declared, after `comment`.
  std::string config_file(const std::string& comment) const;

 private:
  Record& declare(const char* name, const po::value_semantic* semantic, const std::string& help,
                  std::function<std::string()> value);

  std::deque<po::options_description> sections_;
  std::deque<Record> records_;  // a deque: a Flag's Record& stays valid as more are declared
};

}  // namespace gpt2p::cli
