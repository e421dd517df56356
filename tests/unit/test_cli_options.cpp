// The shared option parser (cli/options.h): flags written out in full with a "did you mean" for a
// misspelled one, --config FILE under the command line, and the config file a program writes
// back.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpt2p/cli/options.h"
#include "gpt2p/core/names.h"
#include "support/temp_dir.h"

namespace po = gpt2p::cli::po;
using gpt2p::cli::config_value;
using gpt2p::cli::ConfigEntries;
using gpt2p::cli::to_config_file;
using gpt2p::cli::UsageError;

namespace {

enum class Color { kRed, kGreen };
constexpr std::array<gpt2p::Named<Color>, 2> names(Color) {
  return {{{Color::kRed, "red"}, {Color::kGreen, "green"}}};
}

struct Flags {
  int epochs = -1;  // -1: not given
  int64_t batch_size = 16;
  double lr = 1e-4;
  std::string out = "runs/x";
  bool overwrite = false;
  Color color = Color::kRed;
  int64_t max_steps = 0;
  int warmup_epochs = 1;
  uint64_t seed = 11868;
};

void positive_epochs(int n) {
  if (n <= 0) throw UsageError("--epochs " + std::to_string(n) + " must be positive");
}

// A few flags of each kind the programs declare, bound to `f`.
// clang-format off
void add_flags(po::options_description& desc, Flags& f) {
  desc.add_options()
      ("epochs", po::value(&f.epochs)->notifier(positive_epochs), "passes")
      ("batch-size", po::value(&f.batch_size)->default_value(f.batch_size), "batch")
      ("lr", po::value(&f.lr)->default_value(f.lr), "rate")
      ("out", po::value(&f.out)->default_value(f.out), "directory")
      ("overwrite", po::bool_switch(&f.overwrite), "replace")
      ("color", gpt2p::cli::named_value(f.color, "color"), "red | green")
      ("max-steps", po::value(&f.max_steps)->default_value(f.max_steps), "steps")
      ("warmup-epochs", po::value(&f.warmup_epochs)->default_value(f.warmup_epochs), "warm-up")
      ("seed", po::value(&f.seed)->default_value(f.seed), "seed");
}
// clang-format on

// Runs parse_or_help as "prog WORDS..." would; `help` says whether it printed the help.
Flags parse(std::vector<std::string> words, bool* help = nullptr) {
  words.insert(words.begin(), "prog");
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  Flags f;
  po::options_description desc("prog options");
  add_flags(desc, f);
  po::variables_map vm;
  const bool run = gpt2p::cli::parse_or_help("prog", "A test program.", desc,
                                             static_cast<int>(argv.size()), argv.data(), vm);
  if (help != nullptr) *help = !run;
  return f;
}

// The UsageError's message, or "(none)".
std::string error_of(std::vector<std::string> words) {
  try {
    parse(std::move(words));
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    return what;
  }
  return "(none)";
}

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

const char* const kHint = " (run 'prog --help' for the flags)";

}  // namespace

TEST(CliFlags, LongFlagsMustBeWrittenOutInFull) {
  EXPECT_EQ(parse({"--epochs", "3"}).epochs, 3);
  EXPECT_EQ(error_of({"--epoch", "3"}),
            std::string("unrecognised option '--epoch': did you mean --epochs?") + kHint);
  EXPECT_EQ(error_of({"--epoch=3"}),
            std::string("unrecognised option '--epoch': did you mean --epochs?") + kHint);
  // A prefix of one flag only, once guessed as that flag, is refused too.
  EXPECT_EQ(error_of({"--max", "5"}),
            std::string("unrecognised option '--max': did you mean --max-steps?") + kHint);
  EXPECT_EQ(error_of({"--warmup", "2"}),
            std::string("unrecognised option '--warmup': did you mean --warmup-epochs?") + kHint);
  bool help = false;
  testing::internal::CaptureStdout();
  parse({"-h"}, &help);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: prog"), std::string::npos);
  EXPECT_TRUE(help);
}

TEST(CliFlags, MisspellingsGetTheClosestFlags) {
  EXPECT_EQ(error_of({"--epcohs", "3"}),
            std::string("unrecognised option '--epcohs': did you mean --epochs?") + kHint);
  EXPECT_EQ(error_of({"--Epochs", "3"}),
            std::string("unrecognised option '--Epochs': did you mean --epochs?") + kHint);
  EXPECT_EQ(error_of({"--bach-size", "3"}),
            std::string("unrecognised option '--bach-size': did you mean --batch-size?") + kHint);
  EXPECT_EQ(error_of({"--output", "runs/a"}),
            std::string("unrecognised option '--output': did you mean --out?") + kHint);
  EXPECT_EQ(error_of({"--frobnicate", "1"}),
            std::string("unrecognised option '--frobnicate'") + kHint);
}

TEST(CliFlags, UnderscoresForHyphens) {
  EXPECT_EQ(error_of({"--batch_size", "32"}),
            std::string("unrecognised option '--batch_size': did you mean --batch-size?") + kHint);
  EXPECT_EQ(error_of({"--max_steps=4"}),
            std::string("unrecognised option '--max_steps': did you mean --max-steps?") + kHint);
}

TEST(CliFlags, SingleDashLongFlag) {
  EXPECT_EQ(error_of({"-epochs", "3"}),
            std::string("unrecognised option '-epochs': did you mean --epochs?") + kHint);
  EXPECT_EQ(error_of({"-batch-size", "3"}),
            std::string("unrecognised option '-batch-size': did you mean --batch-size?") + kHint);
}

TEST(CliFlags, BadValuesOnTheCommandLineAsBefore) {
  EXPECT_EQ(error_of({"--epochs", "0"}), "--epochs 0 must be positive");
  EXPECT_EQ(error_of({"--color", "blue"}), "--color 'blue' is not one of: red | green");
  EXPECT_NE(error_of({"--epochs", "abc"}).find("the argument ('abc') for option '--epochs'"),
            std::string::npos);
}

TEST(CliFlags, WordsNoFlagTakes) {
  EXPECT_EQ(error_of({"--overwrite", "false"}),
            std::string("--overwrite is a switch and takes no value: drop 'false' (a switch is off "
                        "unless given; turn off one a config file sets in the file)") +
                kHint);
  EXPECT_EQ(
      error_of({"--epochs", "1", "2"}),
      std::string("unexpected argument '2': a value follows its flag, as --name VALUE") + kHint);
  EXPECT_EQ(error_of({"runs/a"}),
            std::string("unexpected argument 'runs/a': a value follows its flag, as --name VALUE") +
                kHint);
  EXPECT_TRUE(parse({"--overwrite", "--epochs", "1"}).overwrite);
}

TEST(CliFlags, HelpListsConfig) {
  testing::internal::CaptureStdout();
  bool help = false;
  parse({"--help", "--config", "/no/such/file.ini"}, &help);  // help first: the file is not read
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(help);
  EXPECT_NE(out.find("--config FILE"), std::string::npos) << out;
  EXPECT_NE(out.find("--epochs"), std::string::npos) << out;
}

TEST(CliConfig, ReadsTheFile) {
  gpt2p::testing::TempDir dir("cli_config");
  const auto path = write(dir / "run.ini",
                          "# a run\n"
                          "\n"
                          "epochs = 3\n"
                          "  batch-size=32   # global\n"
                          "lr = 0.0003\n"
                          "out = runs/my run\n"
                          "overwrite = true\n"
                          "color = green\n"
                          "seed = 18446744073709551615\n");
  const Flags f = parse({"--config", path});
  EXPECT_EQ(f.epochs, 3);
  EXPECT_EQ(f.batch_size, 32);
  EXPECT_DOUBLE_EQ(f.lr, 3e-4);
  EXPECT_EQ(f.out, "runs/my run");
  EXPECT_TRUE(f.overwrite);
  EXPECT_EQ(f.color, Color::kGreen);
  EXPECT_EQ(f.seed, 18446744073709551615ULL);
  EXPECT_EQ(f.max_steps, 0);  // not in the file: the default
  EXPECT_FALSE(parse({"--config", write(dir / "off.ini", "overwrite = false\n")}).overwrite);
  // Windows line ends, a value with '=' and no line end at the end of the file.
  const Flags crlf =
      parse({"--config", write(dir / "crlf.ini", "epochs = 2\r\nout = a=b\r\nlr = 1")});
  EXPECT_EQ(crlf.epochs, 2);
  EXPECT_EQ(crlf.out, "a=b");
  EXPECT_EQ(crlf.lr, 1);
}

TEST(CliConfig, CommandLineWinsOverTheFile) {
  gpt2p::testing::TempDir dir("cli_config");
  const auto path =
      write(dir / "run.ini", "epochs = 3\nbatch-size = 32\ncolor = green\noverwrite = false\n");
  for (const auto& words : std::vector<std::vector<std::string>>{
           {"--epochs", "5", "--config", path, "--color", "red", "--overwrite"},
           {"--config=" + path, "--epochs=5", "--color=red", "--overwrite"}}) {
    const Flags f = parse(words);
    EXPECT_EQ(f.epochs, 5);
    EXPECT_EQ(f.batch_size, 32);
    EXPECT_EQ(f.color, Color::kRed);
    EXPECT_TRUE(f.overwrite);
  }
  // A bad value in the file is not read where the command line sets the flag.
  const auto bad = write(dir / "bad.ini", "epochs = 0\n");
  EXPECT_EQ(parse({"--config", bad, "--epochs", "2"}).epochs, 2);
}

TEST(CliConfig, UnknownKeyNamesItsLine) {
  gpt2p::testing::TempDir dir("cli_config");
  const auto path = write(dir / "run.ini", "# a run\nbatch-size = 32\nepoch = 3\n");
  EXPECT_EQ(error_of({"--config", path}),
            "config file '" + path +
                "', line 3: unknown key 'epoch': did you mean epochs? (keys are the long flags of "
                "'prog --help' without the dashes)");
  EXPECT_NE(error_of({"--config", write(dir / "u.ini", "batch_size = 3\n")})
                .find("line 1: unknown key 'batch_size': did you mean batch-size?"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", write(dir / "d.ini", "\n--epochs = 3\n")})
                .find("line 2: unknown key '--epochs': did you mean epochs?"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", write(dir / "f.ini", "frobnicate = 1\n")})
                .find("line 1: unknown key 'frobnicate' (keys are"),
            std::string::npos);
}

TEST(CliConfig, BadValueNamesItsLine) {
  gpt2p::testing::TempDir dir("cli_config");
  const auto where = [&dir](const std::string& name) {
    return "config file '" + (dir / name) + "', line 2: ";
  };
  EXPECT_EQ(
      error_of({"--config", write(dir / "a.ini", "lr = 0.1\nepochs = abc\n")}),
      where("a.ini") + "epochs = abc: the argument ('abc') for option 'epochs' is invalid" + kHint);
  // Values a notifier refuses.
  EXPECT_EQ(error_of({"--config", write(dir / "b.ini", "lr = 0.1\nepochs = 0\n")}),
            where("b.ini") + "--epochs 0 must be positive");
  EXPECT_EQ(error_of({"--config", write(dir / "c.ini", "lr = 0.1\ncolor = blue\n")}),
            where("c.ini") + "--color 'blue' is not one of: red | green");
  EXPECT_NE(error_of({"--config", write(dir / "d.ini", "lr = 0.1\noverwrite = maybe\n")})
                .find(where("d.ini") + "overwrite = maybe: the argument ('maybe')"),
            std::string::npos);
}

TEST(CliConfig, LinesThatAreNotNameValue) {
  gpt2p::testing::TempDir dir("cli_config");
  EXPECT_NE(error_of({"--config", write(dir / "a.ini", "epochs 3\n")})
                .find("line 1: 'epochs 3' is not a 'name = value' line: write it as 'epochs = 3'"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", write(dir / "b.ini", "epochs = 3\n[train]\nlr = 1\n")})
                .find("line 2: sections such as '[train]' are not read"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", write(dir / "c.ini", "epochs = 3\nlr = 1\nepochs = 4\n")})
                .find("line 3: 'epochs' is already set on line 1: keep one of the two lines"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", write(dir / "d.ini", " = 3\n")})
                .find("line 1: '= 3' has no name before '='"),
            std::string::npos);
}

TEST(CliConfig, MissingOrUnreadableFile) {
  gpt2p::testing::TempDir dir("cli_config");
  const std::string missing = dir / "none.ini";
  EXPECT_EQ(error_of({"--config", missing}),
            "--config '" + missing +
                "': cannot open it (No such file or directory): pass a readable file of "
                "'name = value' lines");
  EXPECT_NE(error_of({"--config", dir.str()}).find("cannot read it (Is a directory)"),
            std::string::npos);
}

TEST(CliConfig, OneConfigFileOnly) {
  gpt2p::testing::TempDir dir("cli_config");
  const auto a = write(dir / "a.ini", "epochs = 3\n");
  const auto b = write(dir / "b.ini", "epochs = 4\n");
  EXPECT_EQ(error_of({"--config", a, "--config", b}),
            "--config is given more than once: pass one config file (flags on the command line "
            "override its lines)");
  EXPECT_NE(error_of({"--config", write(dir / "c.ini", "epochs = 3\nconfig = " + b + "\n")})
                .find("line 2: a config file cannot name another"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", write(dir / "d.ini", "help = true\n")})
                .find("line 1: help cannot be set in a config file"),
            std::string::npos);
}

TEST(CliConfig, RequiredFlagFromTheFile) {
  gpt2p::testing::TempDir dir("cli_config");
  const auto run = [](std::vector<std::string> words) {
    words.insert(words.begin(), "prog");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    std::string checkpoint;
    po::options_description desc;
    desc.add_options()("checkpoint", po::value(&checkpoint)->required(), "model");
    po::variables_map vm;
    gpt2p::cli::parse_or_help("prog", "A test program.", desc, static_cast<int>(argv.size()),
                              argv.data(), vm);
    return checkpoint;
  };
  EXPECT_EQ(run({"--config", write(dir / "a.ini", "checkpoint = runs/a b\n")}), "runs/a b");
  try {
    run({"--config", write(dir / "b.ini", "# nothing\n")});
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the option '--checkpoint' is required but missing"),
              std::string::npos)
        << e.what();
  }
}

TEST(CliConfig, WrittenFileReadsBackTheSameValues) {
  gpt2p::testing::TempDir dir("cli_config");
  const Flags given = parse({"--config", write(dir / "in.ini", "out = runs/a b c\nlr = 3e-4\n"),
                             "--epochs", "7", "--color", "green", "--overwrite", "--seed",
                             "18446744073709551615", "--batch-size", "-3"});
  po::options_description desc;
  Flags scratch;
  add_flags(desc, scratch);
  const ConfigEntries entries = {{"epochs", config_value(given.epochs)},
                                 {"batch-size", config_value(given.batch_size)},
                                 {"lr", config_value(given.lr)},
                                 {"out", config_value(given.out)},
                                 {"overwrite", config_value(given.overwrite)},
                                 {"color", config_value(given.color)},
                                 {"max-steps", config_value(given.max_steps)},
                                 {"warmup-epochs", config_value(given.warmup_epochs)},
                                 {"seed", config_value(given.seed)}};
  const std::string text = to_config_file(entries, desc, "prog's run\nrun again with --config");
  EXPECT_EQ(text,
            "# prog's run\n# run again with --config\nepochs = 7\nbatch-size = -3\nlr = 0.0003\n"
            "out = runs/a b c\noverwrite = true\ncolor = green\nmax-steps = 0\nwarmup-epochs = 1\n"
            "seed = 18446744073709551615\n");
  const Flags back = parse({"--config", write(dir / "out.ini", text)});
  EXPECT_EQ(back.epochs, given.epochs);
  EXPECT_EQ(back.batch_size, given.batch_size);
  EXPECT_EQ(back.lr, given.lr);
  EXPECT_EQ(back.out, given.out);
  EXPECT_EQ(back.overwrite, given.overwrite);
  EXPECT_EQ(back.color, given.color);
  EXPECT_EQ(back.max_steps, given.max_steps);
  EXPECT_EQ(back.warmup_epochs, given.warmup_epochs);
  EXPECT_EQ(back.seed, given.seed);
  // A switch that is off and an empty string read back too.
  const std::string off =
      to_config_file({{"overwrite", config_value(false)}, {"out", config_value("")}}, desc);
  EXPECT_EQ(off, "overwrite = false\nout = \n");
  const Flags off_back = parse({"--config", write(dir / "off.ini", off), "--epochs", "1"});
  EXPECT_FALSE(off_back.overwrite);
  EXPECT_EQ(off_back.out, "");
}

TEST(CliConfig, NumbersAreWrittenShortAndExact) {
  EXPECT_EQ(config_value(60.0), "60");
  EXPECT_EQ(config_value(65536.0), "65536");
  EXPECT_EQ(config_value(-0.0), "0");
  EXPECT_EQ(config_value(0.0003), "0.0003");
  EXPECT_EQ(config_value(3e-5), "3e-05");
  EXPECT_EQ(config_value(1e20), "1e+20");
  for (const double v : {60.0, 0.1, 1.0 / 3.0, 123456789012345.0, 1e300, -2.5}) {
    EXPECT_EQ(std::strtod(config_value(v).c_str(), nullptr), v) << config_value(v);
  }
}

TEST(CliConfig, WriteRefusesWhatWouldNotReadBack) {
  po::options_description desc;
  Flags scratch;
  add_flags(desc, scratch);
  const auto refused = [&desc](const ConfigEntries& entries) {
    try {
      to_config_file(entries, desc);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(none)");
  };
  EXPECT_NE(refused({{"epoch", "3"}}).find("not a long flag"), std::string::npos);
  EXPECT_NE(refused({{"help", "true"}}).find("does not set help"), std::string::npos);
  EXPECT_NE(refused({{"config", "a.ini"}}).find("does not set config"), std::string::npos);
  EXPECT_NE(refused({{"epochs", "3"}, {"epochs", "4"}}).find("given twice"), std::string::npos);
  EXPECT_NE(refused({{"out", "runs/#1"}}).find("'#'"), std::string::npos);
  EXPECT_NE(refused({{"out", "a\nb"}}).find("line break"), std::string::npos);
  EXPECT_NE(refused({{"out", " a"}}).find("spaces at either end"), std::string::npos);
  EXPECT_NE(refused({{"epochs", "abc"}}).find("does not take this value"), std::string::npos);
  EXPECT_NE(refused({{"overwrite", "maybe"}}).find("does not take this value"), std::string::npos);
}

TEST(CliConfig, DoublesAreWrittenShortAndExact) {
  EXPECT_EQ(config_value(1e-4), "0.0001");
  EXPECT_EQ(config_value(0.1), "0.1");
  EXPECT_EQ(config_value(65536.0), "65536");
  EXPECT_EQ(config_value(2.5e-7), "2.5e-07");
  const double third = 1.0 / 3;
  EXPECT_EQ(std::stod(config_value(third)), third);
  EXPECT_EQ(config_value(int64_t{-1}), "-1");
  EXPECT_EQ(config_value(true), "true");
  EXPECT_EQ(config_value(Color::kGreen), "green");
}
