// polykv-bench pool: what compaction costs everyone else. Latency of the
// Session calls (Reserve, Commit, Sync) of sessions that do not compact, with
// and without other sessions compacting continuously, on one in-process
// KvPool (host arenas, no gRPC: the figure is the pool's own serialization).
//
//   polykv-bench pool [--json] [--latency-sessions 8] [--compacting-sessions 8]
//       [--compactor-threads 1] [--policy h2o] [--budget-tokens 16384]
//       [--layers 30] [--seconds 4]
//
// Each latency session runs its own thread: Reserve one block, Commit it,
// Sync, with a 200 us pause between rounds (an agent's decode step, not a
// spin), releasing back to one block every 64 blocks. The compacting sessions
// (policy --policy at --budget-tokens) are driven round-robin by
// --compactor-threads threads: grow to the trigger (budget + budget/10),
// report attention, Sync (the daemon decides and copies), Ack. One driver
// thread by default: on a 2-core machine more would measure CPU scheduling,
// not the pool. A third phase is the control: the same threads copy memory
// without touching the pool, so that the CPU they take from the latency
// sessions is told apart from the time those wait for the pool's lock.
// Output: p50/p99/max per call in each phase, the ratio p99(compacting) /
// p99(idle) — the figure issue 10 asks to keep <= 1.5 — and p99(compacting)
// / p99(control).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "daemon/pool/kv_pool.h"

namespace polykv::bench {
namespace {

using daemon::KvPool;
using SteadyClock = std::chrono::steady_clock;

struct Options {
  int latency_sessions = 8;
  int compacting_sessions = 8;
  int compactor_threads = 1;
  std::string policy = "h2o";
  uint64_t budget_tokens = 16384;
  uint32_t layers = 30;
  double seconds = 4;
  bool json = false;
};

struct Handle {
  uint64_t id = 0;
  std::string token;
  uint64_t epoch = 0;
  uint64_t reserved = 0;
  uint64_t committed = 0;
};

const daemon::PeerCreds kPeer{1, 1000, 1000};

absl::StatusOr<Handle> OpenSession(KvPool& pool, const std::string& agent, uint32_t layers) {
  daemon::OpenRequest r;
  r.agent_id = agent;
  r.tenant = "bench";
  // One KV head of 64 dims: 256 B per token and layer in f16, so 8 sessions
  // at a 16K budget stay near 1 GiB.
  r.profile = {layers, 1, 64, daemon::DType::kF16, "bench"};
  r.lease_ms = 600000;
  r.peer = kPeer;
  auto o = pool.Open(r);
  if (!o.ok()) return o.status();
  return Handle{o->session_id, o->token, o->epoch, 0, 0};
}

// Latencies in microseconds, per call kind.
struct Samples {
  std::vector<double> reserve, commit, sync, report, ack;
  void Append(const Samples& o) {
    for (auto [to, from] : {std::pair{&reserve, &o.reserve}, {&commit, &o.commit},
                            {&sync, &o.sync}, {&report, &o.report}, {&ack, &o.ack}}) {
      to->insert(to->end(), from->begin(), from->end());
    }
  }
};

Json Summary(std::vector<double> v) {
  if (v.empty()) return Json::object();
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * double(v.size())))]; };
  return {{"calls", v.size()}, {"p50_us", Round(at(0.5), 1)}, {"p99_us", Round(at(0.99), 1)},
          {"max_us", Round(v.back(), 1)}};
}

double P99(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(0.99 * double(v.size())))];
}

template <typename Fn>
auto Timed(std::vector<double>& out, Fn fn) {
  const auto t0 = SteadyClock::now();
  auto r = fn();
  out.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
  return r;
}

// One latency session's loop until `stop`.
absl::Status LatencyLoop(KvPool& pool, Handle h, const std::atomic<bool>& stop, Samples& out) {
  while (!stop.load(std::memory_order_relaxed)) {
    if (h.reserved >= 64 * 16) {
      auto r = pool.Release(h.id, h.token, kPeer, 16);
      if (!r.ok()) return r.status();
      h.reserved = r->reserved_tokens;
      h.committed = r->committed_tokens;
    }
    auto r = Timed(out.reserve, [&] { return pool.Reserve(h.id, h.token, kPeer, 16); });
    if (!r.ok()) return r.status();
    h.reserved = r->reserved_tokens;
    auto c = Timed(out.commit, [&] { return pool.Commit(h.id, h.token, kPeer, h.reserved); });
    if (!c.ok()) return c.status();
    h.committed = *c;
    auto s = Timed(out.sync, [&] { return pool.Sync(h.id, h.token, kPeer, h.epoch); });
    if (!s.ok()) return s.status();
    h.epoch = s->epoch;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return absl::OkStatus();
}

// Grows `h` to the compaction trigger, reports attention, Syncs (which
// compacts) and Acks. Returns whether the Sync changed the tables.
// `out` gets the latency of each call (what the compacting session itself
// waits; its lock holds are part of it).
absl::StatusOr<bool> CompactOnce(KvPool& pool, Handle& h, uint64_t budget, std::mt19937& rng,
                                 Samples& out) {
  const uint64_t trigger = budget + budget / 10 + 16;
  if (h.committed < trigger) {
    auto r = Timed(out.reserve,
                   [&] { return pool.Reserve(h.id, h.token, kPeer, trigger - h.reserved + 1); });
    if (!r.ok()) return r.status();
    h.reserved = r->reserved_tokens;
    const uint64_t before = h.committed;
    auto c = Timed(out.commit, [&] { return pool.Commit(h.id, h.token, kPeer, trigger); });
    if (!c.ok()) return c.status();
    h.committed = *c;
    // Attention of the new tokens: heavy-tailed, as real attention mass is.
    daemon::ReportSlotsRequest rep;
    rep.epoch = h.epoch;
    rep.first_slot = before;
    std::exponential_distribution<float> mass(1.0f);
    auto& attention = rep.scores.emplace_back();
    attention.stream = policies::ScoreStream::kAttention;
    for (uint64_t i = before; i < h.committed; ++i) attention.values.push_back(mass(rng));
    if (auto st = Timed(out.report, [&] { return pool.ReportSlots(h.id, h.token, kPeer, rep); });
        !st.ok()) {
      return st;
    }
  }
  auto s = Timed(out.sync, [&] { return pool.Sync(h.id, h.token, kPeer, h.epoch); });
  if (!s.ok()) return s.status();
  h.epoch = s->epoch;
  h.committed = s->committed_tokens;
  if (s->changed) {
    h.reserved = uint64_t(s->blocks.size()) * 16;
    if (auto st = Timed(out.ack, [&] { return pool.Ack(h.id, h.token, kPeer, h.epoch); });
        !st.ok()) {
      return st;
    }
  }
  return s->changed;
}

struct Phase {
  Samples samples;    // latency sessions
  Samples compactor;  // compacting sessions
  uint64_t compactions = 0;
  double seconds = 0;
};

// What the compacting threads do in a phase: nothing, compact, or only burn
// CPU and memory bandwidth like a compaction's copy (the control: it shows
// how much of a latency change is the 2-core machine, not the pool's lock).
enum class Load { kNone, kCompact, kCpuOnly };

absl::StatusOr<Phase> RunPhase(KvPool& pool, std::vector<Handle>& latency,
                               std::vector<Handle>& compacting, const Options& o, Load load) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> compactions{0};
  std::vector<Samples> per(latency.size());
  std::vector<Samples> per_compactor(size_t(o.compactor_threads));
  std::vector<absl::Status> errors(latency.size() + size_t(o.compactor_threads));
  std::vector<std::thread> threads;
  const auto t0 = SteadyClock::now();
  for (size_t i = 0; i < latency.size(); ++i) {
    threads.emplace_back([&, i] { errors[i] = LatencyLoop(pool, latency[i], stop, per[i]); });
  }
  if (load == Load::kCpuOnly) {
    for (int t = 0; t < o.compactor_threads; ++t) {
      threads.emplace_back([&] {
        std::vector<char> a(64 << 20, 1), b(64 << 20);
        while (!stop.load(std::memory_order_relaxed)) {
          std::memcpy(b.data(), a.data(), a.size());
          std::swap(a, b);
        }
      });
    }
  }
  if (load == Load::kCompact) {
    for (int t = 0; t < o.compactor_threads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(uint32_t(t) + 1);
        while (!stop.load(std::memory_order_relaxed)) {
          for (size_t j = size_t(t); j < compacting.size(); j += size_t(o.compactor_threads)) {
            auto r = CompactOnce(pool, compacting[j], o.budget_tokens, rng, per_compactor[size_t(t)]);
            if (!r.ok()) {
              errors[latency.size() + size_t(t)] = r.status();
              return;
            }
            if (*r) compactions.fetch_add(1);
            if (stop.load(std::memory_order_relaxed)) return;
          }
        }
      });
    }
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop = true;
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.ok()) return e;
  }
  Phase p;
  for (const auto& s : per) p.samples.Append(s);
  for (const auto& s : per_compactor) p.compactor.Append(s);
  p.compactions = compactions.load();
  p.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return p;
}

Json PhaseJson(const Phase& p) {
  Json j = {{"seconds", Round(p.seconds, 2)},
            {"compactions", p.compactions},
            {"reserve", Summary(p.samples.reserve)},
            {"commit", Summary(p.samples.commit)},
            {"sync", Summary(p.samples.sync)}};
  if (!p.compactor.sync.empty()) {
    j["compacting_sessions_calls"] = {{"reserve", Summary(p.compactor.reserve)},
                                      {"commit", Summary(p.compactor.commit)},
                                      {"report_slots", Summary(p.compactor.report)},
                                      {"sync", Summary(p.compactor.sync)},
                                      {"ack", Summary(p.compactor.ack)}};
  }
  return j;
}

int Usage(const char* msg) {
  if (msg) std::fprintf(stderr, "polykv-bench pool: %s\n", msg);
  std::fprintf(stderr,
               "usage: polykv-bench pool [--json] [--latency-sessions 8] [--compacting-sessions 8]\n"
               "         [--compactor-threads 1] [--policy h2o] [--budget-tokens 16384]\n"
               "         [--layers 30] [--seconds 4]\n");
  return msg ? 2 : 0;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto num = [&](auto& field) {
      if (v == nullptr || !absl::SimpleAtoi(v, &field)) return false;
      ++i;
      return true;
    };
    bool ok = true;
    if (a == "--json") {
      o.json = true;
    } else if (a == "--help" || a == "-h") {
      return Usage(nullptr);
    } else if (a == "--latency-sessions") {
      ok = num(o.latency_sessions) && o.latency_sessions > 0;
    } else if (a == "--compacting-sessions") {
      ok = num(o.compacting_sessions) && o.compacting_sessions > 0;
    } else if (a == "--compactor-threads") {
      ok = num(o.compactor_threads) && o.compactor_threads > 0;
    } else if (a == "--budget-tokens") {
      ok = num(o.budget_tokens) && o.budget_tokens >= 64;
    } else if (a == "--layers") {
      ok = num(o.layers) && o.layers > 0 && o.layers <= 128;
    } else if (a == "--seconds") {
      ok = v != nullptr && absl::SimpleAtod(v, &o.seconds) && o.seconds > 0;
      ++i;
    } else if (a == "--policy" && v != nullptr) {
      o.policy = v;
      ++i;
    } else {
      return Usage(("unknown or incomplete argument " + a).c_str());
    }
    if (!ok) return Usage(("bad value for " + a).c_str());
  }
  o.compactor_threads = std::min(o.compactor_threads, o.compacting_sessions);

  // Room for the compacting sessions at their trigger plus a compaction's new
  // pages each, and the latency sessions: nothing here measures refusals.
  const uint64_t per_token = uint64_t(o.layers) * 2 * 128;
  const uint64_t bytes = uint64_t(o.compacting_sessions) * (o.budget_tokens * 23 / 10 + 64) *
                             per_token + (256ull << 20);
  daemon::KvPoolOptions po;
  po.pool_bytes = bytes;
  po.low_watermark_bytes = 1ull << 20;  // keep the pressure ladder out of it
  po.arena_factory = daemon::CreateHostShmArena;
  auto pool = KvPool::Create(po);
  if (!pool.ok()) {
    std::fprintf(stderr, "polykv-bench pool: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  daemon::QosRecord q;
  q.agent_id = "compacting";
  q.policy = o.policy;
  q.budget_tokens = o.budget_tokens;
  if (auto r = (*pool)->SetQos(q); !r.ok()) {
    std::fprintf(stderr, "polykv-bench pool: --policy: %s\n", std::string(r.status().message()).c_str());
    return 2;
  }
  std::vector<Handle> latency, compacting;
  for (int i = 0; i < o.latency_sessions + o.compacting_sessions; ++i) {
    const bool lat = i < o.latency_sessions;
    auto h = OpenSession(**pool, lat ? "latency" : "compacting", o.layers);
    if (!h.ok()) {
      std::fprintf(stderr, "polykv-bench pool: open: %s\n", std::string(h.status().message()).c_str());
      return 1;
    }
    (lat ? latency : compacting).push_back(*h);
  }
  // Bring every compacting session to its budget once, so the measured phase
  // starts in the steady state (each round then adds ~10% and compacts).
  std::fprintf(stderr, "pool: warming %d compacting sessions to %lu tokens\n",
               o.compacting_sessions, static_cast<unsigned long>(o.budget_tokens));
  std::mt19937 rng(7);
  Samples warm;
  for (auto& h : compacting) {
    auto r = CompactOnce(**pool, h, o.budget_tokens, rng, warm);
    if (!r.ok()) {
      std::fprintf(stderr, "polykv-bench pool: warm-up: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "pool: %.1f s without compaction\n", o.seconds);
  auto idle = RunPhase(**pool, latency, compacting, o, Load::kNone);
  std::fprintf(stderr, "pool: %.1f s with %d sessions compacting\n", o.seconds,
               o.compacting_sessions);
  auto busy = idle.ok() ? RunPhase(**pool, latency, compacting, o, Load::kCompact) : idle;
  std::fprintf(stderr, "pool: %.1f s with the compactor threads copying memory only\n",
               o.seconds);
  auto cpu = busy.ok() ? RunPhase(**pool, latency, compacting, o, Load::kCpuOnly) : busy;
  if (!cpu.ok()) {
    std::fprintf(stderr, "polykv-bench pool: %s\n", std::string(cpu.status().message()).c_str());
    return 1;
  }
  if (auto st = (*pool)->CheckInvariants(); !st.ok()) {
    std::fprintf(stderr, "polykv-bench pool: accounting: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const auto ratio = [&](const std::vector<double>& b, const std::vector<double>& i) {
    const double base = P99(i);
    return base > 0 ? Round(P99(b) / base, 2) : 0.0;
  };
  Json out = {{"bench", "pool"},
              {"latency_sessions", o.latency_sessions},
              {"compacting_sessions", o.compacting_sessions},
              {"compactor_threads", o.compactor_threads},
              {"policy", o.policy},
              {"budget_tokens", o.budget_tokens},
              {"layers", o.layers},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"idle", PhaseJson(*idle)},
              {"compacting", PhaseJson(*busy)},
              {"cpu_control", PhaseJson(*cpu)},
              {"p99_ratio",
               {{"reserve", ratio(busy->samples.reserve, idle->samples.reserve)},
                {"commit", ratio(busy->samples.commit, idle->samples.commit)},
                {"sync", ratio(busy->samples.sync, idle->samples.sync)}}},
              {"p99_ratio_vs_cpu_control",
               {{"reserve", ratio(busy->samples.reserve, cpu->samples.reserve)},
                {"commit", ratio(busy->samples.commit, cpu->samples.commit)},
                {"sync", ratio(busy->samples.sync, cpu->samples.sync)}}}};
  if (o.json) {
    PrintJson(out);
  } else {
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace polykv::bench

POLYKV_BENCH(pool, "Reserve/Commit/Sync latency of idle sessions while others compact",
             [](int argc, char** argv) -> int { return polykv::bench::Main(argc, argv); });
