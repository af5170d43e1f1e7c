// The worker against a real polykvd: with the pool storing f32 pages and no
// eviction, greedy output over a multi-turn agent script must equal
// --local-cache token for token (the acceptance check). Starts its own
// daemon on a private socket; skips when polykvd or the model is absent.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/test_util.h"

namespace polykv::worker {
namespace {

std::string Polykvd() {
  if (const char* p = std::getenv("POLYKVD_BIN"); p != nullptr) return p;
  if (const char* d = std::getenv("POLYKV_BIN_DIR"); d != nullptr) return std::string(d) + "/polykvd";
  return "";
}

std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::vector<std::string> Texts(const std::string& out) {
  std::vector<std::string> texts;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    auto v = ParseJson(out.substr(start, end - start));
    if (v.ok() && v->is_object() && (*v).count("text")) texts.push_back((*v).at("text").get_ref<const std::string&>());
    start = end + 1;
  }
  return texts;
}

// A polykvd on a private socket for one test, stopped with SIGTERM.
class Daemon {
 public:
  // Empty socket() when polykvd is not built.
  Daemon() {
    const std::string daemon = Polykvd();
    struct stat st;
    if (daemon.empty() || stat(daemon.c_str(), &st) != 0) return;
    dir_ = ::testing::TempDir() + "/polykv_worker_pool_" + std::to_string(getpid());
    mkdir(dir_.c_str(), 0700);
    const std::string sock = dir_ + "/polykvd.sock";
    unlink(sock.c_str());
    pid_ = fork();
    if (pid_ < 0) return;
    if (pid_ == 0) {
      freopen((dir_ + "/polykvd.log").c_str(), "w", stderr);
      execl(daemon.c_str(), daemon.c_str(), "--socket", sock.c_str(), "--metrics-address", "off",
            "--pool-bytes", "256MiB", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 100 && stat(sock.c_str(), &st) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    socket_ = sock;
  }
  ~Daemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  const std::string& socket() const { return socket_; }

 private:
  std::string dir_, socket_;
  pid_t pid_ = -1;
};

// Runs `script` (a fixture script) with `model` (a fetch-model.sh name, or
// "" for the default) against --local-cache and a fresh polykvd with f32
// pages; both must give the same greedy texts, `turns` of them.
void CheckPoolEqualsLocal(const std::string& model, const std::string& script_name, size_t turns) {
  const std::string script = std::string(POLYKV_WORKER_FIXTURES) + "/scripts/" + script_name;
  std::string base = std::string(POLYKV_WORKER_BIN) + " run " + script + " --max-new-tokens 32 ";
  if (!model.empty()) base += "--model " + model + " ";
  std::vector<std::string> local, pool;
  {
    Daemon d;
    if (d.socket().empty()) POLYKV_MISSING_INPUT() << "polykvd not built (" << Polykvd() << "); set POLYKVD_BIN";
    local = Texts(Capture(base + "--local-cache"));
    pool = Texts(Capture(base + "--daemon " + d.socket() + " --key-format f32 --value-format f32 2>&1"));
  }
  ASSERT_EQ(local.size(), turns);
  EXPECT_EQ(pool, local);
}

TEST(WorkerPoolTest, F32PoolGreedyEqualsLocalCache) {
  POLYKV_REQUIRE_MODEL();
  CheckPoolEqualsLocal("", "coder.jsonl", 3);
}

// Qwen2.5-Coder-0.5B on the tool-calling agent (tools, tool calls, tool runs).
TEST(WorkerPoolTest, F32PoolGreedyEqualsLocalCacheQwen) {
  auto path = ModelPath("qwen2.5-coder-0.5b");
  struct stat st;
  if (!path.ok() || stat(path->c_str(), &st) != 0) {
    POLYKV_MISSING_INPUT() << "run scripts/fetch-model.sh qwen2.5-coder-0.5b";
  }
  CheckPoolEqualsLocal("qwen2.5-coder-0.5b", "tool_coder.jsonl", 2);
}

// The first turn's "attached_tokens" in a worker's output (-1 when absent).
double FirstAttached(const std::string& out) {
  const size_t end = out.find('\n');
  auto v = ParseJson(out.substr(0, end));
  if (!v.ok() || !v->is_object() || !v->count("attached_tokens")) return -1;
  return (*v).at("attached_tokens").get<double>();
}

// Shared prefixes on the product path: a worker shares the pages of its
// first two messages (the system prompt alone is under a page); a second
// one, same script, attaches them instead of computing them and still answers token for token
// as the local cache does (f32 pages: the KV it reads is the KV it would
// have computed).
TEST(WorkerPoolTest, AnAttachedPrefixGivesTheSameGreedyOutput) {
  POLYKV_REQUIRE_MODEL();
  const std::string script = std::string(POLYKV_WORKER_FIXTURES) + "/scripts/coder.jsonl";
  // No intent probe: it would prefill the 15-token system message alone
  // first, less than a page, and the attach would find no whole page (it
  // also changes where the prompt is cut into pieces: every run here). One
  // token per prefill step: the attaching worker runs fewer tokens in its
  // first step than the others, and a product over more rows may round
  // otherwise; one row at a time, every run computes every token alike.
  const std::string base = std::string(POLYKV_WORKER_BIN) + " run " + script +
                           " --max-new-tokens 32 --no-intent-probe --prefill-chunk 1 ";
  Daemon d;
  if (d.socket().empty()) POLYKV_MISSING_INPUT() << "polykvd not built (" << Polykvd() << "); set POLYKVD_BIN";
  const std::vector<std::string> local = Texts(Capture(base + "--local-cache"));
  const std::string pooled = base + "--daemon " + d.socket() +
                             " --key-format f32 --value-format f32 --share-prefix-messages 2";
  const std::string first = Capture(pooled + " --agent first");
  const std::string second = Capture(pooled + " --agent second");
  EXPECT_EQ(FirstAttached(first), 0) << first;
  EXPECT_GT(FirstAttached(second), 0) << second;
  ASSERT_EQ(local.size(), 3u);
  EXPECT_EQ(Texts(first), local);
  EXPECT_EQ(Texts(second), local);
}

// A session whose QoS budget makes polykvd compact it: the worker adopts the
// new tables (its epoch counts them), holds fewer slots than it wrote, and
// reports the bytes it held before the compactions as its peak.
TEST(WorkerPoolTest, CompactedSessionReportsEpochAndPeakBytes) {
  POLYKV_REQUIRE_MODEL();
  const char* bin_dir = std::getenv("POLYKV_BIN_DIR");
  const std::string ctl = bin_dir != nullptr ? std::string(bin_dir) + "/polykvctl" : "";
  struct stat st;
  if (ctl.empty() || stat(ctl.c_str(), &st) != 0) POLYKV_MISSING_INPUT() << "polykvctl not built (" << ctl << ")";
  Daemon d;
  if (d.socket().empty()) POLYKV_MISSING_INPUT() << "polykvd not built (" << Polykvd() << "); set POLYKVD_BIN";
  const std::string set = Capture(ctl + " --socket " + d.socket() +
                                  " qos set small --policy window --budget-tokens 48"
                                  // 16-token pages and a budget of 48 tokens, not the
                                  // default QoS's 64-token pages and half the context.
                                  " --block-tokens 0 --budget-fraction 0 2>&1");
  ASSERT_NE(set.find("window"), std::string::npos) << set;
  const std::string script = std::string(POLYKV_WORKER_FIXTURES) + "/scripts/coder.jsonl";
  const std::string out =
      Capture(std::string(POLYKV_WORKER_BIN) + " run " + script + " --max-new-tokens 32 --daemon " +
              d.socket() + " --agent small --key-format f16 --value-format f16 --summary" +
              // The intent probe after each prefill reserves room for the next
              // tokens at the end of every turn, so the last table can be the
              // largest; without it the last compaction leaves it below the peak.
              " --no-intent-probe");
  std::optional<JsonValue> summary;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    auto v = ParseJson(out.substr(start, end - start));
    if (v.ok() && v->is_object() && v->count("summary")) summary = *v;
    start = end + 1;
  }
  ASSERT_TRUE(summary.has_value()) << out;
  EXPECT_GT(testing::Field(*summary, "epoch").get<double>(), 0) << out;
  const double written = testing::Field(*summary, "prompt_tokens").get<double>() +
                         testing::Field(*summary, "completion_tokens").get<double>();
  EXPECT_LT(testing::Field(*summary, "cached_tokens").get<double>(), written - 48) << out;
  EXPECT_GT(testing::Field(*summary, "kv_bytes_peak").get<double>(),
            testing::Field(*summary, "kv_bytes").get<double>()) << out;
}

}  // namespace
}  // namespace polykv::worker
