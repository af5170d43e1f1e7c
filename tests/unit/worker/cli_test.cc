// polykv-worker as a process: the output format of `run` (one JSON line per
// generated turn, stable field names), reproducibility with --seed, the
// answer_prefix and --count-tokens that bench/eval/eval.py --live relies on,
// and clear errors for bad scripts and flags.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together when merge_stderr.
};

Result RunWorker(const std::string& args, bool merge_stderr = false) {
  const std::string cmd = std::string(POLYKV_WORKER_BIN) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string WriteScript(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << body;
  return path;
}

std::vector<JsonValue> Lines(const std::string& out) {
  std::vector<JsonValue> v;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    if (end > start) {
      auto j = ParseJson(out.substr(start, end - start));
      EXPECT_TRUE(j.ok()) << out.substr(start, end - start);
      if (j.ok()) v.push_back(*j);
    }
    start = end + 1;
  }
  return v;
}

TEST(WorkerCliTest, RunPrintsOneLinePerGeneratedTurn) {
  POLYKV_REQUIRE_MODEL();
  const std::string script = WriteScript("cli_run.jsonl",
      "{\"role\": \"system\", \"content\": \"You are terse.\"}\n"
      "{\"role\": \"user\", \"content\": \"Say hi.\", \"intent\": \"greet\"}\n"
      "{\"role\": \"assistant\", \"id\": \"t1\", \"max_new_tokens\": 6}\n"
      "\n"
      "{\"role\": \"tool\", \"content\": \"ok\"}\n"
      "{\"role\": \"assistant\", \"id\": 7}\n");
  const Result a = RunWorker("run " + script + " --local-cache --max-new-tokens 5 --seed 3 --temperature 0.8 --top-p 0.9");
  ASSERT_EQ(a.code, 0) << a.out;
  const auto lines = Lines(a.out);
  ASSERT_EQ(lines.size(), 2u) << a.out;
  for (const char* key : {"id", "text", "prompt_tokens", "completion_tokens", "cached_tokens",
                          "prefill_ms", "decode_ms", "prefill_tokens_per_s",
                          "decode_tokens_per_s", "stop", "agent", "turn", "cache", "kv_bytes",
                          "kv_bytes_peak", "epoch", "tokens"}) {
    EXPECT_EQ(lines[0].count(key), 1u) << key;
  }
  EXPECT_EQ(testing::Field(lines[0], "id").get_ref<const std::string&>(), "t1");
  EXPECT_EQ(testing::Field(lines[1], "id").get_ref<const std::string&>(), "7");
  EXPECT_LE(testing::Field(lines[0], "completion_tokens").get<double>(), 6);
  EXPECT_LE(testing::Field(lines[1], "completion_tokens").get<double>(), 5);
  EXPECT_EQ(testing::Field(lines[0], "cache").get_ref<const std::string&>(), "local-f32");
  // Same seed, same output text.
  const Result b = RunWorker("run " + script + " --local-cache --max-new-tokens 5 --seed 3 --temperature 0.8 --top-p 0.9");
  const auto lines_b = Lines(b.out);
  ASSERT_EQ(lines_b.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(testing::Field(lines[i], "text").get_ref<const std::string&>(), testing::Field(lines_b[i], "text").get_ref<const std::string&>());
  }
}

// The generated ids come with the text; an answer_prefix is prefilled, not
// generated, and echoed beside the text.
TEST(WorkerCliTest, TurnsCarryTokenIdsAndAnswerPrefix) {
  POLYKV_REQUIRE_MODEL();
  const std::string script = WriteScript("cli_prefix.jsonl",
      "{\"role\": \"user\", \"content\": \"The code is K-42. What is the code?\"}\n"
      "{\"role\": \"assistant\", \"id\": \"a\", \"max_new_tokens\": 8}\n"
      "{\"role\": \"user\", \"content\": \"And again?\"}\n"
      "{\"role\": \"assistant\", \"id\": \"b\", \"max_new_tokens\": 8, "
      "\"answer_prefix\": \"The code is\"}\n");
  const Result r = RunWorker("run " + script + " --local-cache --summary");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (int i = 0; i < 2; ++i) {
    const JsonValue& t = lines[i];
    const auto& tokens = testing::Field(t, "tokens");
    ASSERT_TRUE(tokens.is_array());
    // Every sampled token but an end-of-turn one is in the list.
    const bool eos = testing::Field(t, "stop").get_ref<const std::string&>() == "eos";
    EXPECT_EQ(static_cast<double>(tokens.size()) + (eos ? 1 : 0),
              testing::Field(t, "completion_tokens").get<double>());
    EXPECT_GE(testing::Field(t, "kv_bytes_peak").get<double>(),
              testing::Field(t, "kv_bytes").get<double>());
    EXPECT_EQ(testing::Field(t, "epoch").get<double>(), 0);
  }
  EXPECT_EQ(lines[0].count("answer_prefix"), 0u);
  EXPECT_EQ(testing::Field(lines[1], "answer_prefix").get_ref<const std::string&>(), "The code is");
  // The prefix is part of the prompt: "The code is" adds tokens to turn b's
  // prefill, and the text is what follows it.
  const Result plain = RunWorker("run " + WriteScript("cli_noprefix.jsonl",
      "{\"role\": \"user\", \"content\": \"The code is K-42. What is the code?\"}\n"
      "{\"role\": \"assistant\", \"id\": \"a\", \"max_new_tokens\": 8}\n"
      "{\"role\": \"user\", \"content\": \"And again?\"}\n"
      "{\"role\": \"assistant\", \"id\": \"b\", \"max_new_tokens\": 8}\n") + " --local-cache");
  const auto plain_lines = Lines(plain.out);
  ASSERT_EQ(plain_lines.size(), 2u) << plain.out;
  EXPECT_GT(testing::Field(lines[1], "prompt_tokens").get<double>(),
            testing::Field(plain_lines[1], "prompt_tokens").get<double>());
  EXPECT_EQ(testing::Field(lines[2], "kv_bytes_peak").get<double>(),
            testing::Field(lines[1], "kv_bytes_peak").get<double>());
}

// --count-tokens runs no model: each message's position is the number of
// tokens before it, so a run's first prefill is the generation line's
// position plus the generation prompt, whatever came before.
TEST(WorkerCliTest, CountTokensGivesMessagePositions) {
  POLYKV_REQUIRE_MODEL();
  const std::string a = WriteScript("cli_count_a.jsonl",
      "{\"role\": \"system\", \"content\": \"You are terse.\"}\n"
      "{\"role\": \"user\", \"content\": \"Say hi.\"}\n"
      "{\"role\": \"assistant\", \"id\": \"g\", \"max_new_tokens\": 2}\n"
      "{\"role\": \"user\", \"content\": \"never counted\"}\n");
  const std::string b = WriteScript("cli_count_b.jsonl",
      "{\"role\": \"system\", \"content\": \"You are terse.\"}\n"
      "{\"role\": \"user\", \"content\": \"Say hi.\"}\n"
      "{\"role\": \"tool\", \"content\": \"ok: 3 files, 12 lines\"}\n"
      "{\"role\": \"assistant\", \"id\": \"g\", \"max_new_tokens\": 2}\n");
  std::vector<double> generation_prompt;
  for (const std::string& script : {a, b}) {
    const Result c = RunWorker("run " + script + " --count-tokens");
    ASSERT_EQ(c.code, 0) << c.out;
    const auto lines = Lines(c.out);
    // The model's geometry, then one line per message up to the generated turn.
    ASSERT_EQ(lines.size(), script == a ? 4u : 5u) << c.out;
    EXPECT_GT(testing::Field(lines[0], "num_layers").get<double>(), 0);
    EXPECT_GT(testing::Field(lines[0], "head_dim").get<double>(), 0);
    EXPECT_EQ(testing::Field(lines[1], "position").get<double>(), 0);
    for (size_t i = 2; i < lines.size(); ++i) {
      EXPECT_GT(testing::Field(lines[i], "position").get<double>(),
                testing::Field(lines[i - 1], "position").get<double>());
    }
    const JsonValue& gen = lines.back();
    EXPECT_TRUE(testing::Field(gen, "generate").get<bool>());
    EXPECT_EQ(testing::Field(gen, "id").get_ref<const std::string&>(), "g");
    EXPECT_EQ(testing::Field(gen, "line").get<double>(), script == a ? 3 : 4);
    const Result r = RunWorker("run " + script + " --local-cache");
    const auto turns = Lines(r.out);
    ASSERT_GE(turns.size(), 1u) << r.out;
    generation_prompt.push_back(testing::Field(turns[0], "prompt_tokens").get<double>() -
                                testing::Field(gen, "position").get<double>());
  }
  // ChatML's "<|im_start|>assistant\n", the same few tokens after any history.
  EXPECT_GT(generation_prompt[0], 0);
  EXPECT_LT(generation_prompt[0], 8);
  EXPECT_EQ(generation_prompt[0], generation_prompt[1]);
}

TEST(WorkerCliTest, BadScriptsAreClearErrors) {
  POLYKV_REQUIRE_MODEL();
  struct Case {
    const char* body;
    const char* message;
  } cases[] = {
      {"{\"role\": \"user\"}\n", ":1: only an assistant line may omit \"content\""},
      {"{\"content\": \"x\"}\n", ":1: missing \"role\""},
      {"{\"role\": \"robot\", \"content\": \"x\"}\n", "unknown role \"robot\""},
      {"{\"role\": \"user\", \"content\": \"x\"}\nnot json\n", ":2: JSON:"},
      {"{\"role\": \"assistant\", \"max_new_tokens\": 0}\n", "must be a positive number"},
  };
  for (const Case& c : cases) {
    const Result r = RunWorker("run " + WriteScript("bad.jsonl", c.body) + " --local-cache", true);
    EXPECT_EQ(r.code, 1) << c.body;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.body << " -> " << r.out;
  }
}

TEST(WorkerCliTest, FlagErrors) {
  const std::string script = WriteScript("ok.jsonl", "{\"role\": \"user\", \"content\": \"x\"}\n");
  Result r = RunWorker("run " + script + " --model /nonexistent/m.gguf --local-cache", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("fetch-model.sh"), std::string::npos) << r.out;
  r = RunWorker("run /nonexistent/script.jsonl --local-cache", true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cannot open the script"), std::string::npos) << r.out;
  if (testing::SharedModel() != nullptr) {
    r = RunWorker("run " + script, true);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("--daemon SOCKET, --local-cache or --local-pages"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace polykv::worker
