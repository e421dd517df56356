// The flag table (cli/flag_table.h): each flag declared once, its --help line and its config file
// line both from that declaration.
#include <gtest/gtest.h>

#include <array>
#include <sstream>
#include <string>
#include <vector>

#include "gpt2p/cli/flag_table.h"
#include "gpt2p/core/names.h"

namespace po = gpt2p::cli::po;
using gpt2p::cli::FlagTable;

namespace {

// The values of --shape, by name (core/names.h).
enum class Shape { kRound, kSquare };
constexpr std::array<gpt2p::Named<Shape>, 2> names(Shape) {
  return {{{Shape::kRound, "round"}, {Shape::kSquare, "square"}}};
}

// The fields the flags set.
struct Flags {
  double lr = 1e-4;
  int epochs = -1;   // not given
  std::string init;  // empty: none
  Shape shape = Shape::kRound;
  bool verbose = false;
  bool overwrite = false;
};

// clang-format off
void declare(FlagTable& t, Flags& f) {
  t.section("Run");
  t.value("epochs", f.epochs, "passes").check({[](int n) { return n > 0; }, "a value > 0"}).written_unless(-1);
  t.value("lr", f.lr, "rate").with_default().check({[](double r) { return r > 0; }, "a rate > 0"});
  t.value("init", f.init, "start from").written_unless("");
  t.section("Output");
  t.named("shape", f.shape, "round | square");
  t.flag("verbose", f.verbose, "say more");
  t.flag("overwrite", f.overwrite, "replace").not_written();
}
// clang-format on

struct Parsed {
  Flags flags;
  std::string config_file;
};

// Parses "prog WORDS...", then writes the config file of what it parsed.
Parsed parse(std::vector<std::string> words) {
  words.insert(words.begin(), "prog");
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  Parsed p;
  FlagTable t;
  declare(t, p.flags);
  po::options_description desc;
  t.add_to(desc);
  po::variables_map vm;
  gpt2p::cli::parse_or_help("prog", "A test program.", desc, static_cast<int>(argv.size()),
                            argv.data(), vm);
  p.config_file = t.config_file("prog's run");
  return p;
}

std::string error_of(std::vector<std::string> words) {
  try {
    parse(std::move(words));
  } catch (const gpt2p::cli::UsageError& e) {
    return e.what();
  }
  return "(none)";
}

}  // namespace

TEST(FlagTable, TheConfigFileWritesEveryFlagInOrderButThoseDeclaredOtherwise) {
  EXPECT_EQ(parse({}).config_file, "# prog's run\nlr = 0.0001\nshape = round\nverbose = false\n");
  const Parsed given = parse({"--verbose", "--overwrite", "--shape", "square", "--init", "a b",
                              "--lr", "3e-4", "--epochs", "3"});
  EXPECT_EQ(given.flags.epochs, 3);
  EXPECT_EQ(given.flags.lr, 3e-4);
  EXPECT_EQ(given.flags.init, "a b");
  EXPECT_EQ(given.flags.shape, Shape::kSquare);
  EXPECT_TRUE(given.flags.verbose);
  EXPECT_TRUE(given.flags.overwrite);
  EXPECT_EQ(given.config_file,
            "# prog's run\nepochs = 3\nlr = 0.0003\ninit = a b\nshape = square\nverbose = true\n");
}

TEST(FlagTable, HelpShowsTheSectionsInOrderAndTheDefaultsDeclared) {
  Flags f;
  FlagTable t;
  declare(t, f);
  po::options_description desc;
  t.add_to(desc);
  std::vector<std::string> flags;
  for (const auto& d : desc.options()) flags.push_back(d->long_name());
  EXPECT_EQ(flags,
            (std::vector<std::string>{"epochs", "lr", "init", "shape", "verbose", "overwrite"}));
  std::ostringstream help;
  help << desc;
  const std::string text = help.str();
  EXPECT_LT(text.find("Run:"), text.find("Output:")) << text;
  EXPECT_NE(text.find("--lr arg (=0.0001)"), std::string::npos) << text;
  EXPECT_NE(text.find("--shape arg (=round)"), std::string::npos) << text;
  EXPECT_NE(text.find("--epochs arg "), std::string::npos) << text;
  EXPECT_EQ(text.find("--epochs arg (="), std::string::npos) << text;
}

TEST(FlagTable, ACheckedFlagRefusesAValueOutOfRangeByName) {
  EXPECT_EQ(error_of({"--epochs", "0"}), "--epochs 0 is out of range: use a value > 0");
  EXPECT_EQ(error_of({"--lr", "-1"}), "--lr -1 is out of range: use a rate > 0");
  EXPECT_EQ(error_of({"--lr", "inf"}), "--lr inf is out of range: use a rate > 0");
  EXPECT_EQ(error_of({"--lr", "1"}), "(none)");
}
