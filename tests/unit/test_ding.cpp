// Ding dictionary parsing on real lines (tests/data/corpus/ding_sample.txt is copied from
// /usr/share/trans/de-en, plus one misaligned and one repeated line, marked by comments).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "gpt2p/core/error.h"
#include "gpt2p/data/ding.h"

namespace gpt2p::data {
namespace {

std::string sample_path() {
  const char* dir = std::getenv("GPT2P_TEST_DATA");
  return std::string(dir != nullptr ? dir : "tests/data") + "/corpus/ding_sample.txt";
}

bool contains(const std::vector<SentencePair>& pairs, const std::string& de,
              const std::string& en) {
  return std::find(pairs.begin(), pairs.end(), SentencePair{de, en}) != pairs.end();
}

TEST(DingStrip, RemovesEveryAnnotationKind) {
  EXPECT_EQ(strip_annotations("Aal {m} (auf der Speisekarte) [cook.]"), "Aal");
  EXPECT_EQ(strip_annotations("eel-smoking business <eelsmoking business> <eel smoking business>"),
            "eel-smoking business");
  EXPECT_EQ(strip_annotations("Armenrecht {n} [jur.] ~Prozesskostenhilfe"), "Armenrecht");
  EXPECT_EQ(strip_annotations("in forma pauperis /IFP/ ~legal aid"), "in forma pauperis");
  EXPECT_EQ(strip_annotations("lakelet ~tarn; pondlet"), "lakelet; pondlet");
  EXPECT_EQ(strip_annotations("bushel /bu.; bsh./"), "bushel");
  EXPECT_EQ(strip_annotations("Abfahrt {f} /Abf./; Abflug {m} [transp.]"), "Abfahrt; Abflug");
  EXPECT_EQ(strip_annotations("Teil (mit (verschachtelter) Klammer) hier"), "Teil hier");
  EXPECT_EQ(strip_annotations("Keep container in a well-ventilated place. (safety note)"),
            "Keep container in a well-ventilated place.");
  EXPECT_EQ(strip_annotations("Er kam (gestern) ."), "Er kam.");
}

TEST(DingStrip, KeepsSlashesInsideWords) {
  EXPECT_EQ(strip_annotations("Eingabe/Ausgabe-Zelle {f}; Ein-/Ausgabe-Zelle {f}"),
            "Eingabe/Ausgabe-Zelle; Ein-/Ausgabe-Zelle");
  EXPECT_EQ(strip_annotations("zwei Stunden vor Abfahrt/Abflug"),
            "zwei Stunden vor Abfahrt/Abflug");
  EXPECT_EQ(strip_annotations("centre [Br.] / center [Am.] /HWRC/"), "centre / center");
}

TEST(DingSentence, Rule) {
  EXPECT_TRUE(looks_like_sentence("Wie ist das überhaupt möglich?", "How is that possible?"));
  EXPECT_TRUE(looks_like_sentence("Er sagte: „Komm her!“", "He said: \"Come here!\""));
  EXPECT_FALSE(looks_like_sentence("Komm!", "Come!"));                     // < 3 words
  EXPECT_FALSE(looks_like_sentence("etw. ist gut so.", "sth. is fine."));  // lowercase start
  EXPECT_FALSE(looks_like_sentence("über den Berg gehen.", "to cross."));  // lowercase umlaut
  EXPECT_FALSE(looks_like_sentence("Aal in Aspik", "Jellied Eel"));        // no final . ! ?
  EXPECT_FALSE(looks_like_sentence("Das ist gut so.", "That is fine"));    // English not a sentence
}

TEST(DingLine, TakesSentenceAlternativesAligned) {
  DingStats st;
  const auto pairs = parse_ding_line(
      "erwünscht {adj} | erwünschte Wirkung | Du bist hier nicht erwünscht. :: desired; welcome | "
      "desired effect | You are not welcome here.",
      DingOptions{}, st);
  ASSERT_EQ(pairs.size(), 1U);
  EXPECT_EQ(pairs[0].de, "Du bist hier nicht erwünscht.");
  EXPECT_EQ(pairs[0].en, "You are not welcome here.");
  EXPECT_EQ(st.alternatives, 3);
  EXPECT_EQ(st.sentences, 1);
}

TEST(DingLine, WordsTakeOnlyTheFirstSynonym) {
  DingStats st;
  DingOptions opt;
  opt.include_words = true;
  const auto pairs = parse_ding_line(
      "Aasfliege {f} [zool.] | Aasfliegen {pl} :: carrion fly; fleshfly; flesh fly | carrion "
      "flies; "
      "fleshflies",
      opt, st);
  ASSERT_EQ(pairs.size(), 2U);
  EXPECT_EQ(pairs[0], (SentencePair{"Aasfliege", "carrion fly"}));
  EXPECT_EQ(pairs[1], (SentencePair{"Aasfliegen", "carrion flies"}));
  EXPECT_EQ(st.words, 2);
}

TEST(DingLine, MisalignedLineIsSkippedWhole) {
  DingStats st;
  DingOptions opt;
  opt.include_words = true;
  const auto pairs =
      parse_ding_line("Aalspieß {m} | Aalspieße {pl} | Er kam. :: eel spear", opt, st);
  EXPECT_TRUE(pairs.empty());
  EXPECT_EQ(st.misaligned_lines, 1);
  EXPECT_EQ(st.alternatives, 0);
}

TEST(DingLine, CommentsMalformedEmptyAndLong) {
  DingStats st;
  DingOptions opt;
  opt.include_words = true;
  opt.max_chars = 10;
  EXPECT_TRUE(parse_ding_line("# Version :: devel", opt, st).empty());
  EXPECT_TRUE(parse_ding_line("", opt, st).empty());
  EXPECT_TRUE(parse_ding_line("kein Trenner hier", opt, st).empty());
  EXPECT_TRUE(parse_ding_line("{m} :: [Br.]", opt, st).empty());
  EXPECT_TRUE(parse_ding_line("Quartalsberichterstattung :: quarterly", opt, st).empty());
  EXPECT_EQ(st.comment_lines, 2);
  EXPECT_EQ(st.malformed_lines, 1);
  EXPECT_EQ(st.dropped_empty, 1);
  EXPECT_EQ(st.dropped_long, 1);
}

TEST(DingFile, SentencesFromRealLines) {
  DingStats st;
  const auto pairs = read_ding(sample_path(), DingOptions{}, &st);
  EXPECT_EQ(st.lines, 32);
  EXPECT_EQ(st.comment_lines, 7);
  EXPECT_EQ(st.misaligned_lines, 1);
  EXPECT_TRUE(contains(pairs, "Er brachte sie mehrmals zu uns nach Hause mit.",
                       "He brought her over to our place several times."));
  EXPECT_TRUE(contains(pairs, "Ihre Beziehung war auf einem Tiefpunkt angelangt.",
                       "Their relationship reached/hit rock bottom."));
  EXPECT_TRUE(
      contains(pairs, "Wie ist das überhaupt möglich?", "How is that possible anyway/at all?"));
  EXPECT_TRUE(contains(pairs, "Behälter an einem gut gelüfteten Ort aufbewahren.",
                       "Keep container in a well-ventilated place."));
  EXPECT_TRUE(contains(pairs, "Sprachkenntnisse erwünscht, aber nicht Bedingung.",
                       "Language skills desirable, but not essential."));
  // Only sentences by default: no dictionary words.
  EXPECT_FALSE(contains(pairs, "Aalsuppe", "eel soup"));
  for (const auto& p : pairs) {
    EXPECT_TRUE(looks_like_sentence(p.de, p.en)) << p.de << " => " << p.en;
    EXPECT_EQ(p.de.find('{'), std::string::npos) << p.de;
    EXPECT_EQ(p.en.find('['), std::string::npos) << p.en;
  }
  EXPECT_EQ(st.pairs, static_cast<int64_t>(pairs.size()));
  EXPECT_EQ(st.sentences, st.pairs + st.duplicates);
}

TEST(DingFile, WordsDedupedInFileOrder) {
  DingStats st;
  DingOptions opt;
  opt.include_words = true;
  const auto pairs = read_ding(sample_path(), opt, &st);
  EXPECT_TRUE(contains(pairs, "Aalsuppe", "eel soup"));
  EXPECT_TRUE(contains(pairs, "Armenrecht", "in forma pauperis"));
  EXPECT_TRUE(contains(pairs, "Bushel", "bushel"));
  EXPECT_TRUE(contains(pairs, "Abfahrt", "departure"));
  EXPECT_TRUE(contains(pairs, "Ludlow", "Ludlovian"));
  EXPECT_TRUE(contains(pairs, "Aalräucherei", "eel smokery"));
  EXPECT_FALSE(contains(pairs, "Aalleiter", "eel ladder"));  // misaligned line
  // The repeated Aalsuppe line gives 2 duplicates (singular and plural), kept once each.
  EXPECT_GE(st.duplicates, 2);
  EXPECT_EQ(std::count(pairs.begin(), pairs.end(), SentencePair{"Aalsuppe", "eel soup"}), 1);
  // File order: Bedrohungsgefühl (first entry line) comes before Aalsuppe (last line).
  const auto a =
      std::find(pairs.begin(), pairs.end(), SentencePair{"Bedrohungsgefühl", "feeling of threat"});
  const auto b = std::find(pairs.begin(), pairs.end(), SentencePair{"Aalsuppe", "eel soup"});
  ASSERT_NE(a, pairs.end());
  EXPECT_LT(a, b);
  // Reading twice gives the same list.
  EXPECT_EQ(read_ding(sample_path(), opt), pairs);
}

TEST(DingFile, MissingFileNamesPathAndFix) {
  try {
    read_ding("/nonexistent/de-en", DingOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/de-en"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--input"), std::string::npos) << e.hint();
  }
}

}  // namespace
}  // namespace gpt2p::data
