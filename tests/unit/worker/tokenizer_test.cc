// Tokenizer and chat template against the fixtures written by
// scripts/make-worker-fixtures.py (Hugging Face `tokenizers` / transformers'
// Jinja rendering), plus the Unicode class helpers.
#include "client/worker/tokenizer.h"

#include "client/worker/chat_template.h"
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

TEST(TokenizerTest, MatchesReferenceOnFixtureStrings) {
  POLYKV_REQUIRE_MODEL();
  const Tokenizer& tok = *model->tokenizer;
  const auto rows = ReadFixture("tokenizer_cases.jsonl");
  ASSERT_GE(rows.size(), 1000u);
  int mismatches = 0, decode_mismatches = 0;
  for (const JsonValue& row : rows) {
    const std::string& text = Field(row, "text").str();
    const std::vector<int32_t> want = IntArray(Field(row, "ids"));
    const std::vector<int32_t> got = tok.Encode(text, /*parse_special=*/true);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "encode " << Escaped(text) << "\n  want " << ::testing::PrintToString(want)
                    << "\n  got  " << ::testing::PrintToString(got);
    }
    const std::string decoded = tok.Decode(want);
    if (decoded != Field(row, "decoded").str() && ++decode_mismatches <= 10) {
      ADD_FAILURE() << "decode of " << Escaped(text) << " gave " << Escaped(decoded);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << rows.size() << " strings";
  EXPECT_EQ(decode_mismatches, 0) << "of " << rows.size() << " strings";
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
    for (const JsonValue& m : *std::get<std::shared_ptr<JsonValue::Array>>(Field(row, "messages").v)) {
      got += t.RenderMessage(Field(m, "role").str(), Field(m, "content").str(), first);
      first = false;
    }
    if (std::get<bool>(Field(row, "add_generation_prompt").v)) got += t.GenerationPrompt(false);
    EXPECT_EQ(got, Field(row, "text").str());
  }
  // A conversation that starts with generation gets the default system message.
  EXPECT_EQ(t.GenerationPrompt(true).rfind("<|im_start|>system\n", 0), 0u);
}

}  // namespace
}  // namespace polykv::worker
