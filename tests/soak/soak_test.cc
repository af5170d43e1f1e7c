// Soak: 64 agents churn sessions and compactions against one live polykvd for
// POLYKV_SOAK_SECONDS (default 600). Each agent is a thread of this process
// with its own client connection (64 worker processes would spend the 2 cores
// on process start-up, not on the daemon), except that some of its sessions
// are run by a polykv-test-worker process it SIGKILLs mid-decode.
//
// An agent loops: open a session; reserve and commit tokens in steps, with a
// Sync at each step boundary (where the daemon compacts sessions of agents
// whose QoS has a policy and a token budget); then close it, release and
// close it, or abandon it (no heartbeat, no calls: the lease reclaims it).
//
// Checks at the end, with every session closed or reclaimed: no leaked pages
// and exact accounting (PoolEmptyAndExact), the invariants held at every
// scrape during the run, polykvd's VmRSS after the run is within
// kRssTolerance of its VmRSS after the warm-up, and no errors but the
// expected ones. Prints one JSON summary line ("soak_summary").
//
//   POLYKV_SOAK_SECONDS=30 ctest --test-dir build -L soak --output-on-failure
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "polykv/client.h"
#include "tests/integration/daemon_process.h"

namespace polykv::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kLeaseMs = 3000;  // a loaded 2-core box must not cost live sessions their lease
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

// Counts of everything the agents did, and of every error by "Rpc:CODE".
// Thread-safety: all methods are thread-safe.
class Tally {
 public:
  void Add(const std::string& what, uint64_t n = 1) {
    absl::MutexLock lock(&mu_);
    counts_[what] += n;
  }
  // An error; `expected` says whether the soak provokes it on purpose.
  void Error(const std::string& rpc, const absl::Status& s, bool expected) {
    absl::MutexLock lock(&mu_);
    const std::string key = absl::StrCat(rpc, ":", absl::StatusCodeToString(s.code()));
    errors_[key] += 1;
    if (!expected) {
      unexpected_[key] += 1;
      if (first_unexpected_.size() < 10) first_unexpected_.push_back(absl::StrCat(key, " ", s.message()));
    }
  }
  uint64_t Get(const std::string& what) {
    absl::MutexLock lock(&mu_);
    return counts_[what];
  }
  std::string Json(const std::map<std::string, uint64_t>& m) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : m) parts.push_back(absl::StrCat("\"", k, "\":", v));
    return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
  }
  std::string CountsJson() { absl::MutexLock lock(&mu_); return Json(counts_); }
  std::string ErrorsJson() { absl::MutexLock lock(&mu_); return Json(errors_); }
  std::string UnexpectedJson() { absl::MutexLock lock(&mu_); return Json(unexpected_); }
  uint64_t NumUnexpected() {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [k, v] : unexpected_) n += v;
    return n;
  }
  std::vector<std::string> FirstUnexpected() {
    absl::MutexLock lock(&mu_);
    return first_unexpected_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> unexpected_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> first_unexpected_ ABSL_GUARDED_BY(mu_);
};

// What an agent does with a session once it has decoded it.
enum class Fate { kClose, kReleaseThenClose, kAbandon, kKill };

Fate DrawFate(std::mt19937& rng) {
  const uint32_t r = rng() % 100;
  if (r < 62) return Fate::kClose;
  if (r < 77) return Fate::kReleaseThenClose;
  if (r < 92) return Fate::kAbandon;
  return Fate::kKill;
}

struct SoakContext {
  std::string socket;
  Clock::time_point end;
  uint64_t seed = 0;
  Tally* tally = nullptr;
};

// QoS of agent i: a quarter h2o and a quarter window at small budgets (their
// sessions are compacted at Sync), an eighth streaming, the rest "full"
// (their sessions grow until the pool's pressure ladder steps in).
v1::QosRecord QosOf(int i) {
  v1::QosRecord q;
  q.set_agent_id(absl::StrCat("soak-", i));
  if (i % 8 < 2) {
    q.set_policy("h2o");
    q.set_budget_tokens(128);
  } else if (i % 8 < 4) {
    q.set_policy("window");
    q.set_budget_tokens(96);
  } else if (i % 8 == 4) {
    q.set_policy("streaming");
    q.set_budget_tokens(160);
  }
  q.set_priority(i % 3 == 0 ? v1::PRIORITY_LOW : v1::PRIORITY_NORMAL);
  return q;
}

// One session decoded in steps; returns false when the session is lost (an
// error was tallied). Abandoned sessions run without heartbeat: their own
// calls keep their lease until they stop calling.
bool Decode(Session& s, std::mt19937& rng, Tally& t, bool abandoning) {
  const uint64_t target = 64 + rng() % 705, step = rng() % 2 ? 16 : 32;
  const uint32_t bt = s.info().block_tokens;
  auto lost = [&t](const char* rpc, const absl::Status& st) {
    t.Error(rpc, st, /*expected=*/false);
    return false;
  };
  for (uint64_t fed = 0, refusals = 0; fed < target;) {
    auto changed = s.Sync();
    if (!changed.ok()) return lost("Sync", changed.status());
    if (*changed) t.Add("compactions_seen");
    const uint64_t committed = s.committed_tokens();
    const uint64_t n = std::min(step, target - fed);
    if (committed + n > s.reserved_tokens()) {
      auto r = s.Reserve(committed + n - s.reserved_tokens());
      if (!r.ok()) {
        // Pressure: a refusal with a retry hint; Sync (the ladder may have
        // marked us for compaction) and retry, up to a point.
        const bool pressure = absl::IsResourceExhausted(r.status());
        t.Error("Reserve", r.status(), pressure);
        if (!pressure || ++refusals > 200) return pressure;
        std::this_thread::sleep_for(std::chrono::milliseconds(10 + rng() % 40));
        continue;
      }
    }
    // Touch every page of the new slots: the mapping must be writable.
    for (uint64_t slot = committed; slot < committed + n; ++slot) {
      for (const Page& p : s.blocks()[slot / bt].pages) {
        static_cast<uint8_t*>(p.addr)[(slot % bt) * 4] = uint8_t(slot);
      }
    }
    if (auto st = s.Commit(committed + n); !st.ok()) return lost("Commit", st);
    std::vector<SlotMeta> meta(n);
    const uint32_t turn = uint32_t(fed / 64);
    for (auto& m : meta) {
      m.turn = turn;
      m.role = turn % 2 ? Role::kAssistant : Role::kUser;
    }
    std::vector<float> attention(committed + n);
    for (auto& a : attention) a = float(rng() % 1000) / 1000.f;
    if (auto st = s.ReportSlots(0, {}, attention, turn); !st.ok()) return lost("ReportSlots", st);
    if (auto st = s.ReportSlots(committed, meta, {}); !st.ok()) return lost("ReportSlots", st);
    fed += n;
    t.Add("tokens_committed", n);
    // Think time: 64 agents share 2 cores with the daemon. Abandoning
    // sessions keep it short, since nothing else renews their lease.
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % (abandoning ? 10 : 30)));
  }
  return true;
}

// A session run by a polykv-test-worker process, SIGKILLed mid-decode.
void RunAndKill(const SoakContext& c, int i, std::mt19937& rng) {
  Subprocess w(TestWorker(c.socket, "agent", absl::StrCat("soak-t", i % 4), absl::StrCat("soak-", i),
                          4096, c.seed * 1000 + rng() % 1000, {"--step", "16"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 1500));
  w.Signal(SIGKILL);
  const int code = w.Wait();
  if (code == 128 + SIGKILL) return c.tally->Add("killed");
  // It finished (or failed) before the kill: its line says how.
  const std::string line = w.ReadAll();
  const int wire = static_cast<int>(FieldNum(line, "code"));
  if (code != 0) {
    c.tally->Error("worker", absl::Status(static_cast<absl::StatusCode>(wire), line),
                   wire == int(absl::StatusCode::kResourceExhausted));
  } else {
    c.tally->Add("worker_finished_before_kill");
  }
}

void Agent(const SoakContext& c, int i) {
  std::mt19937 rng(static_cast<uint32_t>(c.seed * 7919 + i));
  Tally& t = *c.tally;
  auto client = Client::Connect(c.socket, 20000);
  if (!client.ok()) return t.Error("Connect", client.status(), false);
  // Abandoned sessions with the time they were last used: dropped (closed,
  // or NOT_FOUND once reclaimed) after two leases.
  std::vector<std::pair<std::unique_ptr<Session>, Clock::time_point>> abandoned;
  auto drop_abandoned = [&](bool all) {
    std::erase_if(abandoned, [&](auto& a) {
      if (!all && Clock::now() - a.second < std::chrono::milliseconds(2 * kLeaseMs)) return false;
      const absl::Status st = a.first->Close();
      if (!st.ok()) t.Error("CloseAbandoned", st, absl::IsNotFound(st));
      return true;
    });
  };
  while (Clock::now() < c.end) {
    drop_abandoned(false);
    const Fate fate = DrawFate(rng);
    if (fate == Fate::kKill) {
      RunAndKill(c, i, rng);
      continue;
    }
    SessionOptions o;
    o.agent_id = absl::StrCat("soak-", i);
    o.tenant = absl::StrCat("soak-t", i % 4);
    o.profile = {4, 2, 64, DType::kF32, "soak"};  // 4 KiB of K+V pages per token
    o.block_tokens = 16;
    o.heartbeat = fate != Fate::kAbandon;
    auto s = (*client)->OpenSession(o);
    if (!s.ok()) {
      t.Error("OpenSession", s.status(), absl::IsResourceExhausted(s.status()));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    t.Add("sessions_opened");
    if (!Decode(**s, rng, t, fate == Fate::kAbandon)) {
      (void)(*s)->Close();  // lost to an error already tallied
      t.Add("sessions_lost");
      continue;
    }
    if (fate == Fate::kAbandon) {
      abandoned.emplace_back(*std::move(s), Clock::now());
      t.Add("abandoned");
      continue;
    }
    if (fate == Fate::kReleaseThenClose) {
      if (auto st = (*s)->Release((*s)->committed_tokens() / 2); !st.ok()) {
        t.Error("Release", st, false);
      } else {
        t.Add("released");
      }
    }
    if (auto st = (*s)->Close(); !st.ok()) {
      t.Error("Close", st, false);
    } else {
      t.Add("closed");
    }
  }
  drop_abandoned(true);
}

TEST(SoakTest, SixtyFourAgentsChurnSessionsAndCompactions) {
  const uint64_t seconds = EnvOr("POLYKV_SOAK_SECONDS", 600);
  const int agents = static_cast<int>(EnvOr("POLYKV_SOAK_AGENTS", 64));
  const uint64_t seed = EnvOr("POLYKV_SOAK_SEED", 14);
  // The RSS baseline: after a warm-up minute (a quarter of shorter runs).
  const uint64_t warmup_s = std::min<uint64_t>(60, seconds / 4);
  std::printf("soak: %d agents for %llu s, seed %llu (POLYKV_SOAK_SEED), warm-up %llu s\n",
              agents, (unsigned long long)seconds, (unsigned long long)seed,
              (unsigned long long)warmup_s);
  std::fflush(stdout);

  DaemonOptions o;
  o.socket = MakeTempDir("polykv-soak") + "/d.sock";
  o.pool_bytes = "96MiB";  // ~2/3 of what 64 agents at their peak ask for: the ladder works
  o.arena_bytes = "8MiB";
  o.lease_ms = kLeaseMs;
  o.log_level = "warn";
  auto d = DaemonProcess::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  DaemonProcess& daemon = **d;
  for (int i = 0; i < agents; ++i) {
    auto q = daemon.admin().SetQos(QosOf(i));
    ASSERT_TRUE(q.ok()) << q.status();
  }

  Tally tally;
  SoakContext c{o.socket, Clock::now() + std::chrono::seconds(seconds), seed, &tally};
  std::vector<std::thread> threads;
  for (int i = 0; i < agents; ++i) threads.emplace_back(Agent, std::cref(c), i);

  // Meanwhile: the invariants at every scrape, and the RSS baseline.
  uint64_t rss_warm = 0, rss_anon_warm = 0, rss_peak = 0, scrapes = 0, invariant_failures = 0;
  uint64_t fds_warm = 0, fds_peak = 0;
  uint64_t max_sessions = 0, max_used = 0;
  const auto warm_at = Clock::now() + std::chrono::seconds(warmup_s);
  while (Clock::now() < c.end) {
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
    if (rss_warm == 0 && Clock::now() >= warm_at) {
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
  const std::string accounting = WaitForPoolEmptyAndExact(daemon, 8 * kLeaseMs + 60000);
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
      "\"leaked_sessions\":%u,\"leaked_pages\":%llu,\"leaked_bytes\":%llu}\n",
      (unsigned long long)seconds, agents, (unsigned long long)seed, tally.CountsJson().c_str(),
      SampleSum(page, "polykv_compactions_total"), SampleSum(page, "polykv_evicted_tokens_total"),
      SampleSum(page, "polykv_ladder_steps_total"), (unsigned long long)stats->lease_expiries(),
      (unsigned long long)stats->refused_reservations(), (unsigned long long)max_sessions,
      (unsigned long long)max_used, tally.ErrorsJson().c_str(), tally.UnexpectedJson().c_str(),
      (unsigned long long)scrapes, (unsigned long long)invariant_failures,
      (unsigned long long)rss_warm, (unsigned long long)rss_end, (unsigned long long)rss_peak,
      (unsigned long long)rss_allowed, (unsigned long long)rss_anon_warm,
      (unsigned long long)rss_anon_end, (unsigned long long)fds_warm,
      (unsigned long long)fds_end, (unsigned long long)fds_peak,
      Sample(page, "polykv_retired_arenas{kind=\"arenas\"}"),
      Sample(page, "polykv_retired_arenas{kind=\"resident_bytes\"}"),
      Sample(page, "polykv_quarantined_bytes"), stats->num_sessions(),
      (unsigned long long)stats->pool().num_pages(), (unsigned long long)stats->pool().used_bytes());
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
