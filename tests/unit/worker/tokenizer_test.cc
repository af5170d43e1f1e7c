// Tokenizer and chat template against the fixtures written by
// scripts/make-worker-fixtures.py (Hugging Face `tokenizers` / transformers'
// Jinja rendering) and, for Qwen2, scripts/make-qwen-tokenizer-fixture.py;
// plus the Unicode class helpers and NFC.
#include "client/worker/tokenizer.h"

#include <chrono>
#include <fstream>

#include "client/worker/chat_template.h"
#include "client/worker/unicode_nfc.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

using testing::Field;
using testing::IntArray;
using testing::ReadFixture;

std::string Escaped(const std::string& s) { return JsonQuote(s); }

TEST(UnicodeTest, Classes) {
  EXPECT_TRUE(IsUnicodeLetter('a'));
  EXPECT_TRUE(IsUnicodeLetter(0x00E9));   // é
  EXPECT_TRUE(IsUnicodeLetter(0x65E5));   // 日
  EXPECT_FALSE(IsUnicodeLetter('1'));
  EXPECT_FALSE(IsUnicodeLetter(0x0301));  // Combining acute: Mn, not L.
  EXPECT_TRUE(IsUnicodeNumber('7'));
  EXPECT_TRUE(IsUnicodeNumber(0x00B2));   // ² (No)
  EXPECT_TRUE(IsUnicodeNumber(0x0663));   // Arabic-Indic 3 (Nd)
  EXPECT_TRUE(IsUnicodeNumber(0x216B));   // Roman numeral twelve (Nl)
  EXPECT_FALSE(IsUnicodeNumber('x'));
  EXPECT_TRUE(IsUnicodeWhitespace(0x3000));
  EXPECT_TRUE(IsUnicodeWhitespace(0x00A0));
  EXPECT_FALSE(IsUnicodeWhitespace(0x200B));  // Zero-width space is not White_Space.
}

// Every row of `fixture` (>= 1000): Encode(text) equals the reference ids,
// and Decode gives the row's "decoded" text (for Qwen the text after NFC) —
// of our ids when `decode_ours`, else of the reference's. The first 10
// failures of each kind are shown.
void ExpectFixtureIds(const Tokenizer& tok, const std::string& fixture, bool decode_ours) {
  const auto rows = ReadFixture(fixture);
  ASSERT_GE(rows.size(), 1000u);
  int mismatches = 0, decode_mismatches = 0;
  for (const JsonValue& row : rows) {
    const std::string& text = Field(row, "text").get_ref<const std::string&>();
    const std::vector<int32_t> want = IntArray(Field(row, "ids"));
    const std::vector<int32_t> got = tok.Encode(text, /*parse_special=*/true);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "encode " << Escaped(text) << "\n  want " << ::testing::PrintToString(want)
                    << "\n  got  " << ::testing::PrintToString(got);
    }
    const std::string decoded = tok.Decode(decode_ours ? got : want);
    if (decoded != Field(row, "decoded").get_ref<const std::string&>() && ++decode_mismatches <= 10) {
      ADD_FAILURE() << "decode of " << Escaped(text) << " gave " << Escaped(decoded);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << rows.size() << " strings in " << fixture;
  EXPECT_EQ(decode_mismatches, 0) << "of " << rows.size() << " strings in " << fixture;
}

TEST(TokenizerTest, MatchesReferenceOnFixtureStrings) {
  POLYKV_REQUIRE_MODEL();
  const Tokenizer& tok = *model->tokenizer;
  ExpectFixtureIds(tok, "tokenizer_cases.jsonl", /*decode_ours=*/false);
}

TEST(TokenizerTest, SpecialTokensOnlyWhenAsked) {
  POLYKV_REQUIRE_MODEL();
  const Tokenizer& tok = *model->tokenizer;
  const int32_t im_start = tok.TokenId("<|im_start|>");
  ASSERT_GE(im_start, 0);
  EXPECT_TRUE(tok.IsControl(im_start));
  const auto with = tok.Encode("<|im_start|>user", true);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with[0], im_start);
  const auto without = tok.Encode("<|im_start|>user", false);
  EXPECT_EQ(std::count(without.begin(), without.end(), im_start), 0);
  EXPECT_EQ(tok.Decode(without), "<|im_start|>user");
  EXPECT_EQ(tok.Decode(with, /*skip_special=*/true), "user");
}

TEST(ChatTemplateTest, MatchesJinjaRendering) {
  POLYKV_REQUIRE_MODEL();
  const ChatTemplate& t = model->chat_template;
  const auto rows = ReadFixture("chat_template_cases.jsonl");
  ASSERT_FALSE(rows.empty());
  for (const JsonValue& row : rows) {
    std::string got;
    bool first = true;
    for (const JsonValue& m : Field(row, "messages")) {
      got += t.RenderMessage(Field(m, "role").get_ref<const std::string&>(), Field(m, "content").get_ref<const std::string&>(), first);
      first = false;
    }
    if (Field(row, "add_generation_prompt").get<bool>()) got += t.GenerationPrompt(false);
    EXPECT_EQ(got, Field(row, "text").get_ref<const std::string&>());
  }
  // A conversation that starts with generation gets the default system message.
  EXPECT_EQ(t.GenerationPrompt(true).rfind("<|im_start|>system\n", 0), 0u);
}

// ------------------------------------------------------------------ Qwen2

constexpr char kQwenModel[] = "qwen2.5-coder-0.5b";

// The Qwen tokenizer straight from the GGUF (not LoadModel: these tests need
// no weights), opened once; nullptr when the file is absent.
struct QwenTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  double open_ms = 0;  // GgufFile::Open (maps the file, parses the metadata).
  double load_ms = 0;  // Tokenizer::FromGguf alone.
};
const QwenTokenizer* SharedQwenTokenizer() {
  static const QwenTokenizer* shared = []() -> const QwenTokenizer* {
    auto path = ModelPath(kQwenModel);
    if (!path.ok() || !std::ifstream(*path).good()) return nullptr;
    const auto opened = std::chrono::steady_clock::now();
    auto file = GgufFile::Open(*path);
    if (!file.ok()) {
      ADD_FAILURE() << "opening " << *path << ": " << file.status();
      return nullptr;
    }
    const auto start = std::chrono::steady_clock::now();
    auto tok = Tokenizer::FromGguf(**file);
    const auto stop = std::chrono::steady_clock::now();
    if (!tok.ok()) {
      ADD_FAILURE() << "tokenizer of " << *path << ": " << tok.status();
      return nullptr;
    }
    auto* q = new QwenTokenizer{std::move(*tok)};
    q->open_ms = std::chrono::duration<double, std::milli>(start - opened).count();
    q->load_ms = std::chrono::duration<double, std::milli>(stop - start).count();
    return q;
  }();
  return shared;
}

#define POLYKV_REQUIRE_QWEN_TOKENIZER()                                              \
  const QwenTokenizer* qwen = SharedQwenTokenizer();                                 \
  if (qwen == nullptr) {                                                             \
    POLYKV_MISSING_INPUT() << "model " << kQwenModel << " is absent: run scripts/fetch-model.sh " \
                 << kQwenModel;                                                      \
  }                                                                                  \
  const Tokenizer& tok = *qwen->tokenizer

TEST(QwenTokenizerTest, LoadsFromGguf) {
  POLYKV_REQUIRE_QWEN_TOKENIZER();
  std::printf("GgufFile::Open %.1f ms; Tokenizer::FromGguf (151,936 tokens, "
              "151,387 merges) %.1f ms\n", qwen->open_ms, qwen->load_ms);
  ::testing::Test::RecordProperty("from_gguf_ms", static_cast<int>(qwen->load_ms));
  EXPECT_EQ(tok.pre_tokenizer(), Tokenizer::PreTokenizer::kQwen2);
  EXPECT_EQ(tok.vocab_size(), 151936);
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.TokenId("<|im_end|>"), 151645);
  EXPECT_EQ(tok.bos_id(), 151643);
  EXPECT_EQ(tok.TokenId("<|endoftext|>"), 151643);
}

TEST(QwenTokenizerTest, MatchesReferenceOnFixtureStrings) {
  POLYKV_REQUIRE_QWEN_TOKENIZER();
  ExpectFixtureIds(tok, "qwen_tokenizer_cases.jsonl", /*decode_ours=*/true);
}

TEST(QwenTokenizerTest, PreTokenizeTakesEachBranchOfThePattern) {
  POLYKV_REQUIRE_QWEN_TOKENIZER();
  using V = std::vector<std::string>;
  // Expected pieces from Hugging Face's Split over the same pattern.
  const std::vector<std::pair<std::string, V>> cases = {
      // (?i:'s|...): contractions in any case; U+017F folds to 's'.
      {"DON'T I'Ve we'RE", {"DON", "'T", " I", "'Ve", " we", "'RE"}},
      {"x'\u017Fam 'lL", {"x", "'\u017F", "am", " '", "lL"}},
      // [^\r\n\p{L}\p{N}]?\p{L}+: a tab, space or punctuation leads the word.
      {"a\tb  c", {"a", "\tb", " ", " c"}},
      {"(foo) \"bar\"", {"(foo", ")", " \"", "bar", "\""}},
      {"\nfoo", {"\n", "foo"}},
      {"e\u0301t\u00E9", {"e", "\u0301t\u00E9"}},  // U+0301 is Mn, not \p{L}.
      {"\u65E5\u672C\u8A9E \u30C6\u30AD", {"\u65E5\u672C\u8A9E", " \u30C6\u30AD"}},
      // \p{N}: one digit at a time.
      {"x1234", {"x", "1", "2", "3", "4"}},
      {" 42", {" ", "4", "2"}},
      //  ?[^\s\p{L}\p{N}]+[\r\n]*: punctuation takes the newlines after it.
      {" !!\n\nbar", {" !!\n\n", "bar"}},
      {"};\r\n", {"};\r\n"}},
      // \s*[\r\n]+ then \s+(?!\S) then \s+.
      {"  \r\n  x", {"  \r\n", " ", " x"}},
      {"a\n \n b", {"a", "\n \n", " b"}},
      {"a   ", {"a", "   "}},
      {"\t\tx", {"\t", "\tx"}},
      {"if x:\n    return 1\n", {"if", " x", ":\n", "   ", " return", " ", "1", "\n"}},
  };
  for (const auto& [text, want] : cases) {
    EXPECT_EQ(tok.PreTokenize(text), want) << Escaped(text);
  }
}

TEST(QwenTokenizerTest, NormalizesTextButNotSpecialTokens) {
  POLYKV_REQUIRE_QWEN_TOKENIZER();
  EXPECT_EQ(tok.Encode("caf\u00E9", true), tok.Encode("cafe\u0301", true));
  // A special token between "e" and U+0301 keeps them apart: no composition.
  const auto ids = tok.Encode("e<|im_end|>\u0301", true);
  EXPECT_EQ(tok.Decode(ids), "e<|im_end|>\u0301");
  const int32_t tool_call = tok.TokenId("<tool_call>");  // User-defined (type 4).
  ASSERT_GE(tool_call, 0);
  EXPECT_FALSE(tok.IsControl(tool_call));
  EXPECT_EQ(tok.Encode("<tool_call>", true), std::vector<int32_t>{tool_call});
  EXPECT_EQ(tok.Decode(std::vector<int32_t>{tool_call}, /*skip_special=*/true), "<tool_call>");
}

TEST(NfcTest, ComposesReordersAndKeepsWhatIsNormal) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"e\u0301", "\u00E9"},
      {"\u1100\u1161\u11A8", "\uAC01"},            // Hangul jamo L V T.
      {"\uAC00\u11A8", "\uAC01"},                  // LV syllable + T.
      {"a\u0327\u0301", "\u00E1\u0327"},            // Not blocked by the lower class.
      {"a\u0301\u0327", "\u00E1\u0327"},            // Reordered first.
      {"\u212B", "\u00C5"},                         // Singleton (Angstrom sign).
      {"\u0958", "\u0915\u093C"},                   // Composition exclusion.
      {"\u0344", "\u0308\u0301"},                   // Non-starter decomposition.
      {"\u0B47\u0B3E", "\u0B4B"},                   // Two starters compose.
      {"\u1E0B\u0323", "\u1E0D\u0307"},             // Reorder, then recompose.
      {"\u03B1\u0313\u0301\u0345", "\u1F84"},       // Three marks, one composite.
      {"\u0301e", "\u0301e"},                       // Leading mark: nothing to join.
      {"x\u0301\u0301", "x\u0301\u0301"},           // Blocked by the equal class.
      {"plain ascii\n", "plain ascii\n"},
      {"\u65E5\u672C \U0001F600", "\u65E5\u672C \U0001F600"},
      {"e\xFF\u0301", "e\xFF\u0301"},               // Invalid byte: copied, blocks.
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(NormalizeNfc(in), want) << Escaped(in);
  EXPECT_EQ(CanonicalCombiningClass('a'), 0);
  EXPECT_EQ(CanonicalCombiningClass(0x0301), 230);
  EXPECT_EQ(CanonicalCombiningClass(0x0327), 202);
}

}  // namespace
}  // namespace polykv::worker
