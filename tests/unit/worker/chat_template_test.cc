// Chat templates against tests/fixtures/worker/qwen_chat_template_cases.jsonl
// (scripts/make-chat-template-fixtures.py: the GGUF's Jinja template rendered
// as transformers does, token ids from Hugging Face `tokenizers`), through
// ChatTokenizer, the piecewise path Conversation feeds the model from.
//
// The Qwen files are opened with GgufFile + ChatTemplate/Tokenizer directly,
// not LoadModel: only the template and the tokenizer are under test here.
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "client/worker/chat_template.h"
#include "client/worker/chat_tokenizer.h"
#include "client/worker/conversation.h"
#include "client/worker/gguf.h"
#include "client/worker/json.h"
#include "client/worker/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

using testing::Field;
using testing::IntArray;
using testing::ReadFixture;

struct TemplateFiles {
  std::optional<ChatTemplate> chat_template;
  std::unique_ptr<Tokenizer> tokenizer;  // Null when FromGguf refused the file.
  std::string tokenizer_error;
};

// The model's template and tokenizer, opened once per name; nullptr when
// the file is absent.
const TemplateFiles* Files(const std::string& name) {
  static auto* cache = new std::map<std::string, std::unique_ptr<TemplateFiles>>();
  auto it = cache->find(name);
  if (it != cache->end()) return it->second.get();
  std::unique_ptr<TemplateFiles> files;
  auto path = ModelPath(name);
  if (path.ok() && std::ifstream(*path).good()) {
    files = std::make_unique<TemplateFiles>();
    auto file = GgufFile::Open(*path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (file.ok()) {
      auto t = ChatTemplate::FromGguf(**file);
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) files->chat_template = *t;
      auto tok = Tokenizer::FromGguf(**file);
      if (tok.ok()) {
        files->tokenizer = std::move(*tok);
      } else {
        files->tokenizer_error = tok.status().ToString();
      }
    }
  }
  const TemplateFiles* out = files.get();
  (*cache)[name] = std::move(files);
  return out;
}

struct Rendered {
  std::string text;
  std::vector<int32_t> ids;
};

// A fixture row through ChatTokenizer, message by message.
Rendered Render(const TemplateFiles& f, const JsonValue& row, bool with_tokens) {
  ChatTokenizer chat(&*f.chat_template, with_tokens ? f.tokenizer.get() : nullptr);
  std::vector<TaggedToken> tokens;
  Rendered r;
  const JsonValue& tools = Field(row, "tools");
  if (tools.is_array()) {
    EXPECT_TRUE(chat.SetTools(tools).ok());
  }
  int32_t turn = 0;
  for (const JsonValue& m : Field(row, "messages")) {
    auto message = ChatMessageFromJson(m);
    EXPECT_TRUE(message.ok()) << message.status();
    if (message.ok()) r.text += chat.AddMessage(*message, turn++, &tokens);
  }
  r.text += Field(row, "add_generation_prompt").get<bool>()
                ? chat.AddGenerationPrompt(turn, &tokens)
                : chat.Close(&tokens);
  for (const TaggedToken& t : tokens) r.ids.push_back(t.id);
  return r;
}

// Runs `check` on every fixture row of `model`; skips when it is absent.
#define FOR_EACH_CASE(MODEL, FETCH_NAME)                                                     \
  const TemplateFiles* files = Files(MODEL);                                                 \
  if (files == nullptr) POLYKV_MISSING_INPUT() << "run scripts/fetch-model.sh " << (FETCH_NAME);      \
  ASSERT_TRUE(files->chat_template.has_value());                                             \
  const auto rows = ReadFixture("qwen_chat_template_cases.jsonl");                           \
  int num_cases = 0;                                                                         \
  for (const JsonValue& row : rows)                                                          \
    if (Field(row, "model").get_ref<const std::string&>() == (MODEL) && ++num_cases)

constexpr char kQwen[] = "qwen2.5-coder-0.5b";
constexpr char kQwen15[] = "qwen2.5-coder-1.5b";
constexpr char kSmol[] = "smollm2-135m";

TEST(QwenChatTemplateTest, DialectAndDefaultSystem) {
  const TemplateFiles* files = Files(kQwen);
  if (files == nullptr) POLYKV_MISSING_INPUT() << "run scripts/fetch-model.sh " << kQwen;
  ASSERT_TRUE(files->chat_template.has_value());
  EXPECT_EQ(files->chat_template->dialect(), ChatTemplate::Dialect::kQwen);
  EXPECT_EQ(files->chat_template->default_system(),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
}

TEST(QwenChatTemplateTest, TextEqualsJinja) {
  FOR_EACH_CASE(kQwen, kQwen) {
    EXPECT_EQ(Render(*files, row, false).text, Field(row, "text").get_ref<const std::string&>())
        << Field(row, "source").get_ref<const std::string&>();
  }
  EXPECT_GE(num_cases, 40);
}

// The ids are Hugging Face's for the whole rendered text.
TEST(QwenChatTemplateTest, TokenIdsEqualHuggingFace) {
  FOR_EACH_CASE(kQwen, kQwen) {
    ASSERT_NE(files->tokenizer, nullptr) << files->tokenizer_error;
    EXPECT_EQ(Render(*files, row, true).ids, IntArray(Field(row, "ids")))
        << Field(row, "source").get_ref<const std::string&>();
  }
  EXPECT_GE(num_cases, 40);
}

// The 1.5B file's template differs in one literal (doubled braces in the
// tool-call example); same checks.
TEST(QwenChatTemplateTest, TextAndTokenIdsEqualJinja15B) {
  FOR_EACH_CASE(kQwen15, kQwen15) {
    ASSERT_NE(files->tokenizer, nullptr) << files->tokenizer_error;
    const Rendered r = Render(*files, row, true);
    EXPECT_EQ(r.text, Field(row, "text").get_ref<const std::string&>()) << Field(row, "source").get_ref<const std::string&>();
    EXPECT_EQ(r.ids, IntArray(Field(row, "ids"))) << Field(row, "source").get_ref<const std::string&>();
  }
  EXPECT_GE(num_cases, 40);
}

TEST(SmolLmChatTemplateTest, TextAndTokenIdsEqualReference) {
  FOR_EACH_CASE(kSmol, kSmol) {
    ASSERT_NE(files->tokenizer, nullptr) << files->tokenizer_error;
    const Rendered r = Render(*files, row, true);
    EXPECT_EQ(r.text, Field(row, "text").get_ref<const std::string&>()) << Field(row, "source").get_ref<const std::string&>();
    EXPECT_EQ(r.ids, IntArray(Field(row, "ids"))) << Field(row, "source").get_ref<const std::string&>();
  }
  EXPECT_GE(num_cases, 40);
}

}  // namespace
}  // namespace polykv::worker
