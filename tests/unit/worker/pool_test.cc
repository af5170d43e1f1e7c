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

// Runs `script` (a fixture script) with `model` (a fetch-model.sh name, or
// "" for the default) against --local-cache and a fresh polykvd with f32
// pages; both must give the same greedy texts, `turns` of them.
void CheckPoolEqualsLocal(const std::string& model, const std::string& script_name, size_t turns) {
  const std::string daemon = Polykvd();
  struct stat st;
  if (daemon.empty() || stat(daemon.c_str(), &st) != 0) {
    GTEST_SKIP() << "polykvd not built (" << daemon << "); set POLYKVD_BIN";
  }
  const std::string dir = ::testing::TempDir() + "/polykv_worker_pool_" + std::to_string(getpid());
  mkdir(dir.c_str(), 0700);
  const std::string sock = dir + "/polykvd.sock";
  unlink(sock.c_str());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen((dir + "/polykvd.log").c_str(), "w", stderr);
    execl(daemon.c_str(), daemon.c_str(), "--socket", sock.c_str(), "--metrics-address", "off",
          "--pool-bytes", "256MiB", static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 100 && stat(sock.c_str(), &st) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string script = std::string(POLYKV_WORKER_FIXTURES) + "/scripts/" + script_name;
  std::string base = std::string(POLYKV_WORKER_BIN) + " run " + script + " --max-new-tokens 32 ";
  if (!model.empty()) base += "--model " + model + " ";
  const auto local = Texts(Capture(base + "--local-cache"));
  const auto pool = Texts(Capture(base + "--daemon " + sock + " --key-format f32 --value-format f32 2>&1"));
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
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
    GTEST_SKIP() << "run scripts/fetch-model.sh qwen2.5-coder-0.5b";
  }
  CheckPoolEqualsLocal("qwen2.5-coder-0.5b", "tool_coder.jsonl", 2);
}

}  // namespace
}  // namespace polykv::worker
