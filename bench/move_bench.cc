// polykv-bench move: moving a session between two polykvd on loopback, on
// the product path: two in-process daemons with the mutual-TLS peer link
// (certificates from scripts/make-peer-certs.sh), a client session holding
// `tokens` committed tokens of a model's shape in the daemon's default
// formats, a worker thread at its step boundaries (a Sync every millisecond),
// and Admin.MoveSession to and fro. Per move:
//   - the daemon's own report (park, copy, pause = parked until the forward);
//   - the worker's pause: the wall time of the Sync that parked, followed the
//     move and came back with the target's tables (what decode waits for);
//   - throughput: page bytes / copy time, next to memcpy of the same bytes
//     in the same run (the floor of any copy).
// After each move the target's pages are compared with what was written.
//
//   polykv-bench move [--json] [--tokens 4096] [--moves 6]
//       [--layers 24 --kv-heads 2 --head-dim 64]   (Qwen2.5-Coder-0.5B)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "daemon/daemon.h"
#include "polykv/admin.h"
#include "polykv/client.h"

namespace polykv::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes of every page of the session, in block order.
std::vector<std::pair<uint8_t*, uint32_t>> Pages(const Session& s) {
  std::vector<std::pair<uint8_t*, uint32_t>> out;
  for (const Block& b : s.blocks()) {
    for (const Page& p : b.pages) {
      if (p.size_bytes > 0) out.emplace_back(static_cast<uint8_t*>(p.addr), p.size_bytes);
    }
  }
  return out;
}

uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

absl::Status Run(uint32_t tokens, int moves, const ModelProfile& profile, Json& out) {
  char tmpl[] = "/tmp/polykv-bench-move-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string pki = dir + "/pki";
  for (const char* name : {"a", "b"}) {
    const std::string cmd = absl::StrCat("bash ", POLYKV_SOURCE_DIR, "/scripts/make-peer-certs.sh ",
                                         pki, " ", name, " >/dev/null");
    if (std::system(cmd.c_str()) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("failed: ", cmd));
    }
  }
  std::vector<std::unique_ptr<daemon::Daemon>> daemons;
  for (const char* name : {"a", "b"}) {
    daemon::DaemonConfig cfg;
    cfg.socket = absl::StrCat(dir, "/", name, ".sock");
    cfg.metrics_address = "off";
    cfg.pool_bytes = 2ull << 30;
    cfg.log_level = "warn";
    cfg.peer = {"127.0.0.1:0", absl::StrCat(pki, "/", name, ".pem"),
                absl::StrCat(pki, "/", name, ".key"), pki + "/ca.pem"};
    auto d = daemon::Daemon::Create(cfg);
    if (!d.ok()) return d.status();
    if (absl::Status s = (*d)->Start(); !s.ok()) return s;
    daemons.push_back(*std::move(d));
  }
  const std::string sockets[2] = {dir + "/a.sock", dir + "/b.sock"};

  auto client = Client::Connect(sockets[0]);
  if (!client.ok()) return client.status();
  SessionOptions o;
  o.agent_id = "bench-mover";
  o.profile = profile;  // formats: the daemon's shipped default QoS
  auto session = (*client)->OpenSession(o);
  if (!session.ok()) return session.status();
  Session& s = **session;
  if (auto b = s.Reserve(tokens); !b.ok()) return b.status();
  uint64_t bytes = 0;
  {
    uint64_t i = 0;
    for (auto [addr, size] : Pages(s)) {
      for (uint32_t k = 0; k < size; ++k) addr[k] = Pattern(i++);
      bytes += size;
    }
  }
  if (auto st = s.Commit(tokens); !st.ok()) return st;
  std::fprintf(stderr, "move: %u tokens, %s/%s pages, %.1f MiB, %d moves\n", tokens,
               std::string(kernels::FormatShortName(s.info().key_format)).c_str(),
               std::string(kernels::FormatShortName(s.info().value_format)).c_str(),
               double(bytes) / (1 << 20), moves);

  // The worker: a step boundary every millisecond; the Sync that follows a
  // move is its pause.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> moved{0};
  std::vector<double> worker_pause_ms;
  absl::Status worker_error;
  const uint64_t first_id = s.info().session_id;
  std::thread worker([&] {
    while (!stop.load()) {
      const uint64_t before = s.moves();
      const auto t0 = SteadyClock::now();
      auto r = s.Sync();
      const double ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
      if (!r.ok()) {
        worker_error = r.status();
        return;
      }
      if (s.moves() != before) {
        worker_pause_ms.push_back(ms);
        moved.store(s.moves());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  std::vector<double> park_ms, copy_ms, pause_ms, mb_per_s;
  bool bytes_equal = true;
  // The worker thread owns `s` now; the session's id comes from each reply.
  uint64_t id = first_id;
  for (int m = 0; m < moves && worker_error.ok(); ++m) {
    const int from = m % 2;
    auto admin = AdminClient::Connect(sockets[from]);
    if (!admin.ok()) return admin.status();
    auto r = (*admin)->MoveSession(id, daemons[1 - from]->peer_address());
    if (!r.ok()) {
      stop = true;
      worker.join();
      return r.status();
    }
    while (moved.load() != uint64_t(m + 1) && worker_error.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    id = r->target_session_id();
    park_ms.push_back(r->park_seconds() * 1e3);
    copy_ms.push_back(r->copy_seconds() * 1e3);
    pause_ms.push_back(r->pause_seconds() * 1e3);
    mb_per_s.push_back(double(r->bytes()) / r->copy_seconds() / 1e6);
    std::fprintf(stderr, "move %d: %s -> %s, copy %.1f ms, daemon pause %.1f ms\n", m + 1,
                 from ? "b" : "a", from ? "a" : "b", copy_ms.back(), pause_ms.back());
  }
  stop = true;
  worker.join();
  if (!worker_error.ok()) return worker_error;
  {
    uint64_t i = 0;
    for (auto [addr, size] : Pages(s)) {
      for (uint32_t k = 0; k < size; ++k) bytes_equal &= addr[k] == Pattern(i++);
    }
  }
  // memcpy of the same bytes, the floor of any copy (median of 5).
  std::vector<uint8_t> a(bytes, 1), b(bytes);
  std::vector<double> memcpy_mb_s;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = SteadyClock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double sec = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    memcpy_mb_s.push_back(double(bytes) / sec / 1e6);
  }
  const double move_mb_s = Median(mb_per_s);
  out = Json{{"bench", "move"},
             {"path", "two in-process polykvd, peer link gRPC/TCP loopback with mutual TLS"},
             {"model", {{"layers", profile.num_layers},
                        {"kv_heads", profile.num_kv_heads},
                        {"head_dim", profile.head_dim}}},
             {"key_format", kernels::FormatShortName(s.info().key_format)},
             {"value_format", kernels::FormatShortName(s.info().value_format)},
             {"tokens", tokens},
             {"bytes", bytes},
             {"moves", moves},
             {"bytes_equal_after_moves", bytes_equal},
             {"park_ms_median", Round(Median(park_ms), 2)},
             {"copy_ms_median", Round(Median(copy_ms), 2)},
             {"daemon_pause_ms_median", Round(Median(pause_ms), 2)},
             {"worker_pause_ms_median", Round(Median(worker_pause_ms), 2)},
             {"worker_pause_ms_max", Round(*std::max_element(worker_pause_ms.begin(),
                                                             worker_pause_ms.end()), 2)},
             {"move_mb_per_s_median", Round(move_mb_s, 1)},
             {"memcpy_mb_per_s_median", Round(Median(memcpy_mb_s), 1)},
             {"move_over_memcpy", Round(move_mb_s / Median(memcpy_mb_s), 4)}};
  return bytes_equal ? absl::OkStatus()
                     : absl::DataLossError("the session's bytes changed across the moves");
}

int MoveMain(int argc, char** argv) {
  bool json = false;
  uint32_t tokens = 4096;
  uint32_t moves = 6;
  ModelProfile profile{24, 2, 64, DType::kF16, "Qwen2.5-Coder-0.5B"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto num = [&](uint32_t* out) {
      if (i + 1 >= argc || !absl::SimpleAtoi(argv[i + 1], out) || *out == 0) {
        std::fprintf(stderr, "move: %s needs a positive number\n", a.c_str());
        std::exit(2);
      }
      ++i;
    };
    if (a == "--json") {
      json = true;
    } else if (a == "--tokens") {
      num(&tokens);
    } else if (a == "--moves") {
      num(&moves);
    } else if (a == "--layers") {
      num(&profile.num_layers);
    } else if (a == "--kv-heads") {
      num(&profile.num_kv_heads);
    } else if (a == "--head-dim") {
      num(&profile.head_dim);
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "polykv-bench move [--json] [--tokens 4096] [--moves 6]\n"
          "    [--layers 24 --kv-heads 2 --head-dim 64]\n"
          "A session moved to and fro between two in-process polykvd over the mutual-TLS\n"
          "peer link (loopback): throughput next to memcpy, the daemon's and the worker's\n"
          "pause, the bytes checked after the moves.\n");
      return 0;
    } else {
      std::fprintf(stderr, "move: unknown argument %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  Json out;
  absl::Status st = Run(tokens, static_cast<int>(moves), profile, out);
  if (!st.ok()) {
    std::fprintf(stderr, "move: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  if (json) {
    PrintJson(out);
  } else {
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}

}  // namespace

POLYKV_BENCH(move, "a session moved between two polykvd (peer link, mutual TLS)", MoveMain);

}  // namespace polykv::bench
