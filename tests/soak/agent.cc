#include "tests/soak/agent.h"

#include <signal.h>

#include <algorithm>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "polykv/client.h"
#include "tests/integration/daemon_process.h"

namespace polykv::testing {
namespace {

// What an agent does with a session once it has decoded it.
enum class Fate { kClose, kReleaseThenClose, kAbandon, kKill };

Fate DrawFate(std::mt19937& rng) {
  const uint32_t r = rng() % 100;
  if (r < 62) return Fate::kClose;
  if (r < 77) return Fate::kReleaseThenClose;
  if (r < 92) return Fate::kAbandon;
  return Fate::kKill;
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
    if (auto st = s.Report(polykv::ScoreStream::kAttention, 0, std::move(attention)); !st.ok()) {
      return lost("ReportSlots", st);
    }
    if (auto st = s.ReportSlots(committed, meta, {}, turn); !st.ok()) return lost("ReportSlots", st);
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
  Subprocess w(TestWorker(c.socket, "agent", absl::StrCat("soak-t", i % 4),
                          absl::StrCat("soak-", i), 4096, c.seed * 1000 + rng() % 1000,
                          {"--step", "16"}));
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

}  // namespace

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

void Agent(const SoakContext& c, int i) {
  std::mt19937 rng(static_cast<uint32_t>(c.seed * 7919 + i));
  Tally& t = *c.tally;
  auto client = Client::Connect(c.socket, 20000);
  if (!client.ok()) return t.Error("Connect", client.status(), false);
  // Abandoned sessions with the time they were last used, dropped after two
  // leases: the late Close is NOT_FOUND once the lease reclaimed the session,
  // and frees the pages the daemon quarantined for us meanwhile.
  std::vector<std::pair<std::unique_ptr<Session>, SoakClock::time_point>> abandoned;
  auto drop_abandoned = [&](bool all) {
    std::erase_if(abandoned, [&](auto& a) {
      const auto idle = SoakClock::now() - a.second;
      if (!all && idle < std::chrono::milliseconds(2 * kSoakLeaseMs)) return false;
      const absl::Status st = a.first->Close();
      if (!st.ok()) t.Error("CloseAbandoned", st, absl::IsNotFound(st));
      return true;
    });
  };
  while (SoakClock::now() < c.end) {
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
    o.key_format = o.value_format = PageFormat::kF32;  // whatever the agent's QoS
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
      abandoned.emplace_back(*std::move(s), SoakClock::now());
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

}  // namespace polykv::testing
