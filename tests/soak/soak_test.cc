// Soak: 64 agents churn sessions and compactions against one live polykvd for
// POLYKV_SOAK_SECONDS (default 600). Each agent is a thread of this process
// with its own client connection (64 worker processes would spend the 2 cores
// on process start-up, not on the daemon), except that some of its sessions
// are run by a polykv-test-worker process it SIGKILLs mid-decode.
//
// An agent loops: open a session; reserve and commit tokens in steps, with a
// Sync at each step boundary (where the daemon compacts sessions of agents
// whose QoS has a policy and a token budget); then close it, release and
// close it, or abandon it (no heartbeat, no calls: the lease reclaims it and
// quarantines its pages until the agent's late Close, answered NOT_FOUND).
// The agents: tests/soak/agent.{h,cc}.
//
// Checks at the end, with every session closed or reclaimed: no leaked pages
// and exact accounting (PoolEmptyAndExact), the invariants held at every
// scrape during the run, polykvd's VmRSS and RssAnon after the run are
// within max(10%, 16 MiB) of their values after the warm-up, and no errors
// but the expected ones. Prints one JSON summary line ("soak_summary").
//
//   POLYKV_SOAK_SECONDS=30 ctest --test-dir build -L soak --output-on-failure
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "tests/integration/daemon_process.h"
#include "tests/soak/agent.h"

namespace polykv::testing {
namespace {

// polykvd's VmRSS after the run may exceed its VmRSS after the warm-up by at
// most max(10%, 16 MiB): allocator caches and gRPC's per-connection buffers
// come and go; a leak of per-session state over thousands of sessions does not.
// VmRSS counts the arenas' shared memory the daemon has touched (it follows
// the pool's use), so RssAnon (its heap) is held to the same bound.
constexpr double kRssGrowth = 0.10;
constexpr uint64_t kRssSlackBytes = 16ull << 20;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoull(v) : fallback;
}

TEST(SoakTest, SixtyFourAgentsChurnSessionsAndCompactions) {
  const uint64_t seconds = EnvOr("POLYKV_SOAK_SECONDS", 600);
  const int agents = static_cast<int>(EnvOr("POLYKV_SOAK_AGENTS", 64));
  const uint64_t seed = EnvOr("POLYKV_SOAK_SEED", 14);
  // The RSS baseline: after a warm-up minute (a quarter of shorter runs).
  const uint64_t warmup_s = std::min<uint64_t>(60, seconds / 4);
  std::printf("soak: %d agents for %llu s, seed %llu (POLYKV_SOAK_SEED), warm-up %llu s\n", agents,
              (unsigned long long)seconds, (unsigned long long)seed, (unsigned long long)warmup_s);
  std::fflush(stdout);

  DaemonOptions o;
  o.socket = MakeTempDir("polykv-soak") + "/d.sock";
  o.pool_bytes = "96MiB";  // ~2/3 of what 64 agents at their peak ask for: the ladder works
  o.arena_bytes = "8MiB";
  o.lease_ms = kSoakLeaseMs;
  o.log_level = "warn";
  auto d = DaemonProcess::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  DaemonProcess& daemon = **d;
  for (int i = 0; i < agents; ++i) {
    auto q = daemon.admin().SetQos(QosOf(i));
    ASSERT_TRUE(q.ok()) << q.status();
  }

  Tally tally;
  SoakContext c{o.socket, SoakClock::now() + std::chrono::seconds(seconds), seed, &tally};
  std::vector<std::thread> threads;
  for (int i = 0; i < agents; ++i) threads.emplace_back(Agent, std::cref(c), i);

  // Meanwhile: the invariants at every scrape, and the RSS baseline.
  uint64_t rss_warm = 0, rss_anon_warm = 0, rss_peak = 0, scrapes = 0, invariant_failures = 0;
  uint64_t fds_warm = 0, fds_peak = 0;
  uint64_t max_sessions = 0, max_used = 0;
  const auto warm_at = SoakClock::now() + std::chrono::seconds(warmup_s);
  while (SoakClock::now() < c.end) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const std::string page = daemon.Metrics();
    ++scrapes;
    if (Sample(page, "polykv_pool_invariants_ok") != 1) {
      ++invariant_failures;
      std::printf("scrape %llu: polykv_pool_invariants_ok is %g\n", (unsigned long long)scrapes,
                  Sample(page, "polykv_pool_invariants_ok"));
    }
    if (auto s = daemon.Stats(); s.ok()) {
      max_sessions = std::max<uint64_t>(max_sessions, s->num_sessions());
      max_used = std::max<uint64_t>(max_used, s->pool().used_bytes());
    }
    rss_peak = std::max(rss_peak, daemon.RssBytes());
    fds_peak = std::max(fds_peak, daemon.NumFds());
    if (rss_warm == 0 && SoakClock::now() >= warm_at) {
      rss_warm = daemon.RssBytes();
      rss_anon_warm = daemon.RssAnonBytes();
      fds_warm = daemon.NumFds();
      std::printf("soak: after the warm-up VmRSS %llu KiB, RssAnon %llu KiB, %llu fds\n",
                  (unsigned long long)rss_warm >> 10, (unsigned long long)rss_anon_warm >> 10,
                  (unsigned long long)fds_warm);
      std::fflush(stdout);
    }
  }
  for (auto& th : threads) th.join();

  // Killed workers' sessions go with their lease (their pages at the next
  // sweep); the agents closed their abandoned ones, which freed the pages
  // quarantined for them.
  const std::string accounting = WaitForPoolEmptyAndExact(daemon, 8 * kSoakLeaseMs + 60000);
  auto stats = daemon.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  const std::string page = daemon.Metrics();
  const uint64_t rss_end = daemon.RssBytes(), rss_anon_end = daemon.RssAnonBytes();
  const uint64_t fds_end = daemon.NumFds();
  auto allowed = [](uint64_t warm) {
    return warm + std::max<uint64_t>(uint64_t(double(warm) * kRssGrowth), kRssSlackBytes);
  };
  const uint64_t rss_allowed = allowed(rss_warm);

  std::printf(
      "soak_summary {\"seconds\":%llu,\"agents\":%d,\"seed\":%llu,\"counts\":%s,"
      "\"daemon_compactions\":%.0f,\"daemon_evicted_tokens\":%.0f,\"ladder_steps\":%.0f,"
      "\"lease_expiries\":%llu,\"refused_reservations\":%llu,\"max_sessions\":%llu,"
      "\"max_used_bytes\":%llu,\"errors\":%s,\"unexpected_errors\":%s,\"scrapes\":%llu,"
      "\"invariant_failures\":%llu,\"rss_warm_bytes\":%llu,\"rss_end_bytes\":%llu,"
      "\"rss_peak_bytes\":%llu,\"rss_allowed_bytes\":%llu,\"rss_anon_warm_bytes\":%llu,"
      "\"rss_anon_end_bytes\":%llu,\"fds_warm\":%llu,\"fds_end\":%llu,\"fds_peak\":%llu,"
      "\"retired_arenas\":%.0f,\"retired_resident_bytes\":%.0f,\"quarantined_bytes\":%.0f,"
      "\"relocated_blocks\":%.0f,\"leaked_sessions\":%u,\"leaked_pages\":%llu,\"leaked_bytes\":%llu}\n",
      (unsigned long long)seconds, agents, (unsigned long long)seed, tally.CountsJson().c_str(),
      SampleSum(page, "polykv_compactions_total"), SampleSum(page, "polykv_evicted_tokens_total"),
      SampleSum(page, "polykv_ladder_steps_total"), (unsigned long long)stats->lease_expiries(),
      (unsigned long long)stats->refused_reservations(), (unsigned long long)max_sessions,
      (unsigned long long)max_used, tally.ErrorsJson().c_str(), tally.UnexpectedJson().c_str(),
      (unsigned long long)scrapes, (unsigned long long)invariant_failures,
      (unsigned long long)rss_warm, (unsigned long long)rss_end, (unsigned long long)rss_peak,
      (unsigned long long)rss_allowed, (unsigned long long)rss_anon_warm,
      (unsigned long long)rss_anon_end, (unsigned long long)fds_warm, (unsigned long long)fds_end,
      (unsigned long long)fds_peak, Sample(page, "polykv_retired_arenas{kind=\"arenas\"}"),
      Sample(page, "polykv_retired_arenas{kind=\"resident_bytes\"}"),
      Sample(page, "polykv_quarantined_bytes"), Sample(page, "polykv_relocated_blocks_total"),
      stats->num_sessions(),
      (unsigned long long)stats->pool().num_pages(),
      (unsigned long long)stats->pool().used_bytes());
  std::fflush(stdout);

  EXPECT_EQ(accounting, "") << "after every agent closed or abandoned its sessions";
  EXPECT_EQ(invariant_failures, 0u);
  EXPECT_GT(tally.Get("sessions_opened"), 0u);
  EXPECT_GT(SampleSum(page, "polykv_compactions_total"), 0) << "no compaction happened";
  EXPECT_EQ(tally.NumUnexpected(), 0u) << absl::StrJoin(tally.FirstUnexpected(), "\n");
  ASSERT_GT(rss_warm, 0u);
  EXPECT_LE(rss_end, rss_allowed) << "polykvd's VmRSS grew from " << rss_warm << " to " << rss_end;
  EXPECT_LE(rss_anon_end, allowed(rss_anon_warm))
      << "polykvd's RssAnon grew from " << rss_anon_warm << " to " << rss_anon_end;
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace polykv::testing
