// End to end, the policy engine under 4x oversubscription: a real polykvd and
// 8 synthetic agent processes (polykv-test-worker agent) that decode in steps,
// write a per-position pattern into their pages, report slot metadata and
// attention, and adopt compacted tables at step boundaries. Together they ask
// for 4x the pool; every agent must finish within its budget, see its epochs
// advance, read only pages that hold the positions the daemon says, and the
// pool must be empty at the end.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <regex>

#include "absl/strings/str_cat.h"
#include "polykv/admin.h"
#include "tests/integration/http.h"
#include "tests/integration/probe.h"
#include "tests/integration/subprocess.h"

namespace polykv {
namespace {

using testing::BinDir;
using testing::Field;
using testing::HttpGet;
using testing::Sample;
using testing::Subprocess;

// budget: tokens per agent. 192 x 8 leaves the pool mostly free (compaction
// by budget alone); 480 x 8 needs more than the pool, so the pressure ladder
// must compact the low-priority agents below their budgets and pause their
// reservations.
void RunAgents(int budget, bool expect_pressure) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "polykv-cit-", getpid());
  mkdir(dir.c_str(), 0700);
  const std::string socket = dir + "/d.sock";
  // A token of the agents' shape (4 layers, 2 KV heads, 64 dims, f32) is
  // 4 KiB of K+V pages, so the 16 MiB pool holds 4096 tokens.
  constexpr uint64_t kPoolBytes = 16ull << 20, kTokenBytes = 4096;
  constexpr int kAgents = 8, kStep = 16;
  const int kBudget = budget;
  constexpr uint64_t kTokensEach = 4 * kPoolBytes / kTokenBytes / kAgents;  // 2048
  Subprocess daemon({BinDir() + "/polykvd", "--socket", socket, "--metrics-address", "127.0.0.1:0",
                     "--pool-bytes", "16MiB", "--arena-bytes", "4MiB", "--lease-ms", "3000"});
  uint64_t refusals = 0, min_epoch = ~0ull;
  auto admin = AdminClient::Connect(socket, 20000);
  ASSERT_TRUE(admin.ok()) << admin.status();
  const char* kPolicies[] = {"window", "streaming", "h2o", "h2o{window.ratio=0.25}"};
  for (int i = 0; i < kAgents; ++i) {
    v1::QosRecord q;
    q.set_agent_id(absl::StrCat("agent-", i));
    q.set_policy(kPolicies[i % 4]);
    q.set_budget_tokens(kBudget);
    q.set_priority(i < 4 ? v1::PRIORITY_LOW : v1::PRIORITY_NORMAL);
    auto r = (*admin)->SetQos(q);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // Every agent opens its session, then waits for the others: on a loaded
  // machine agents start seconds apart, and without the barrier the first
  // could finish before the last begins, so the pool would never be short.
  const std::string barrier = absl::StrCat(dir, "/barrier-", budget);
  mkdir(barrier.c_str(), 0700);
  std::vector<std::unique_ptr<Subprocess>> agents;
  for (int i = 0; i < kAgents; ++i) {
    agents.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        BinDir() + "/polykv-test-worker", "agent", "--socket", socket, "--tenant",
        expect_pressure || i % 2 ? "team-b" : "team-a", "--agent", absl::StrCat("agent-", i), "--tokens",
        std::to_string(kTokensEach), "--seed", std::to_string(100 + i), "--step",
        std::to_string(kStep), "--budget", std::to_string(kBudget), "--barrier", barrier,
        "--barrier-count", std::to_string(kAgents)}));
  }
  for (int i = 0; i < kAgents; ++i) {
    const std::string out = agents[i]->ReadLine(120000);
    const int code = agents[i]->Wait();
    std::printf("agent-%d %-24s %s\n", i, kPolicies[i % 4], out.c_str());
    SCOPED_TRACE(absl::StrCat("agent-", i, " (", kPolicies[i % 4], "): ", out));
    EXPECT_EQ(code, 0);
    EXPECT_EQ(Field(out, "ok"), "true");
    // Compacted many times: 2048 tokens through a small budget.
    EXPECT_GE(std::stoull("0" + Field(out, "epoch")), 3u);
    min_epoch = std::min<uint64_t>(min_epoch, std::stoull("0" + Field(out, "epoch")));
    refusals += std::stoull("0" + Field(out, "refusals"));
    // Within budget: at most budget + 10% + one step between compactions.
    EXPECT_LE(std::stoull("0" + Field(out, "max_committed")), kBudget + kBudget / 10 + kStep);
  }
  std::printf("budget %d: fewest epochs %llu, refused reservations retried %llu\n", budget,
              static_cast<unsigned long long>(min_epoch), static_cast<unsigned long long>(refusals));
  auto stats = (*admin)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pool().used_bytes(), 0u) << "pages leaked";
  EXPECT_EQ(stats->num_sessions(), 0u);
  const std::string& address = stats->metrics_address();
  const std::string page =
      HttpGet(std::stoi(address.substr(address.rfind(':') + 1)), "/metrics");
  std::regex engine("polykv_(compaction|evicted|merged|ladder|pending)[^\n]*");
  for (std::sregex_iterator it(page.begin(), page.end(), engine), end; it != end; ++it) {
    std::printf("  %s\n", it->str().c_str());
  }
  EXPECT_GT(Sample(page, "polykv_compactions_total{policy=\"window\"}"), 0);
  EXPECT_GT(Sample(page, "polykv_compactions_total{policy=\"h2o\"}"), 0);
  EXPECT_GT(Sample(page, "polykv_evicted_tokens_total{policy=\"streaming\"}"), 0);
  EXPECT_GT(Sample(page, "polykv_compaction_blocks_total{kind=\"shared\"}"), 0);
  EXPECT_EQ(Sample(page, "polykv_pending_bytes"), 0);
  if (expect_pressure) {
    EXPECT_GT(stats->refused_reservations(), 0u);
    EXPECT_GT(Sample(page, "polykv_ladder_steps_total{step=\"compact\"}"), 0);
  }
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0);
}

TEST(CompactionIntegrationTest, EightAgentsAskingForFourTimesThePoolStayInBudget) {
  RunAgents(192, /*expect_pressure=*/false);
}

TEST(CompactionIntegrationTest, EightAgentsOverThePoolGoThroughThePressureLadder) {
  RunAgents(480, /*expect_pressure=*/true);
}

// The ladder's first step lowers the precision of a low-priority agent's cold
// values in place of evicting them; the agent reads every page at each step,
// requantized ones included, against its pattern encoded in the page's format.
TEST(CompactionIntegrationTest, RequantizedPagesOfALowPriorityAgentHoldItsPattern) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "polykv-requant-", getpid());
  mkdir(dir.c_str(), 0700);
  const std::string socket = dir + "/d.sock";
  // 2048 tokens of 4 KiB (f32 K+V) are 8 MiB: past the watermark's 4 MiB of
  // use, the ladder asks the agent's sessions to shrink.
  Subprocess daemon({BinDir() + "/polykvd", "--socket", socket, "--metrics-address", "127.0.0.1:0",
                     "--pool-bytes", "16MiB", "--arena-bytes", "4MiB", "--low-watermark-bytes",
                     "12MiB", "--lease-ms", "3000"});
  auto admin = AdminClient::Connect(socket, 20000);
  ASSERT_TRUE(admin.ok()) << admin.status();
  v1::QosRecord q;
  q.set_agent_id("cold");
  // A compacting policy (the ladder leaves "full" sessions alone) whose
  // budget is never reached: precision is what the ladder takes.
  q.set_policy("window");
  q.set_budget_tokens(1 << 20);
  q.set_priority(v1::PRIORITY_LOW);
  ASSERT_TRUE((*admin)->SetQos(q).ok());
  Subprocess agent({BinDir() + "/polykv-test-worker", "agent", "--socket", socket, "--tenant",
                    "t", "--agent", "cold", "--tokens", "2048", "--seed", "7", "--step", "32"});
  const std::string out = agent.ReadLine(120000);
  EXPECT_EQ(agent.Wait(), 0) << out;
  EXPECT_EQ(Field(out, "ok"), "true") << out;
  EXPECT_GE(std::stoull("0" + Field(out, "epoch")), 1u) << "no requantization reached the agent";
  auto stats = (*admin)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  const std::string& address = stats->metrics_address();
  const std::string page = HttpGet(std::stoi(address.substr(address.rfind(':') + 1)), "/metrics");
  EXPECT_GT(Sample(page, "polykv_ladder_steps_total{step=\"requant\"}"), 0) << page;
  EXPECT_EQ(stats->pool().used_bytes(), 0u) << "pages leaked";
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0);
}

// An agent that goes idle between steps has its pages taken to the host
// tier by the reaper and brought back by its next Sync: it reads every slot
// of the restored pages against its pattern, and nothing is left behind.
TEST(CompactionIntegrationTest, AnIdleAgentsPagesComeBackFromTheOffloadTierIntact) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "polykv-offload-", getpid());
  mkdir(dir.c_str(), 0700);
  const std::string socket = dir + "/d.sock";
  // The reaper runs every lease / 4 (300 ms): an agent idle for 900 ms is
  // offloaded once it has been idle 50 ms at a sweep.
  Subprocess daemon({BinDir() + "/polykvd", "--socket", socket, "--metrics-address", "127.0.0.1:0",
                     "--pool-bytes", "16MiB", "--arena-bytes", "4MiB", "--lease-ms", "1200",
                     "--offload-host-bytes", "8MiB", "--offload-idle-ms", "50"});
  auto admin = AdminClient::Connect(socket, 20000);
  ASSERT_TRUE(admin.ok()) << admin.status();
  Subprocess agent({BinDir() + "/polykv-test-worker", "agent", "--socket", socket, "--tenant",
                    "t", "--agent", "idler", "--tokens", "512", "--seed", "9", "--step", "32",
                    "--idle-every", "4", "--idle-ms", "900"});
  const std::string out = agent.ReadLine(120000);
  EXPECT_EQ(agent.Wait(), 0) << out;
  EXPECT_EQ(Field(out, "ok"), "true") << out;
  EXPECT_EQ(Field(out, "idles"), "3") << out;
  auto stats = (*admin)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  const std::string& address = stats->metrics_address();
  const std::string page = HttpGet(std::stoi(address.substr(address.rfind(':') + 1)), "/metrics");
  EXPECT_GE(Sample(page, "polykv_offload_total{result=\"offloaded\"}"), 1) << page;
  EXPECT_GE(Sample(page, "polykv_offload_total{result=\"restored\"}"), 1) << page;
  EXPECT_EQ(Sample(page, "polykv_offload_total{result=\"lost\"}"), 0) << page;
  EXPECT_EQ(stats->pool().used_bytes(), 0u) << "pages leaked";
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0);
}

}  // namespace
}  // namespace polykv
