// DaemonProcess: a real polykvd for the integration, fault and soak tests,
// with the probes they share — Admin stats, a metrics scrape, polykvctl, the
// daemon's RSS — and PoolEmptyAndExact, the accounting check they end with.
#pragma once

#include <signal.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "polykv/admin.h"
#include "tests/integration/http.h"
#include "tests/integration/probe.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/wait_until.h"

namespace polykv::testing {

// A fresh folder under the test temp dir, for sockets and barriers.
inline std::string MakeTempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), name, "-", getpid());
  mkdir(dir.c_str(), 0700);
  return dir;
}

// argv of `polykv-test-worker <mode>` against `socket`, plus `extra` flags
// (the modes and their flags: tests/integration/test_worker.cc).
inline std::vector<std::string> TestWorker(const std::string& socket, const std::string& mode,
                                           const std::string& tenant, const std::string& agent,
                                           uint64_t tokens, uint64_t seed,
                                           const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {BinDir() + "/polykv-test-worker", mode, "--socket", socket,
                                   "--tenant", tenant, "--agent", agent, "--tokens",
                                   std::to_string(tokens), "--seed", std::to_string(seed)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

struct DaemonOptions {
  std::string socket;                // gRPC socket; the fd socket is socket + ".fds".
  std::string pool_bytes = "64MiB";  // --pool-bytes
  std::string arena_bytes = "8MiB";  // --arena-bytes
  int lease_ms = 1500;               // --lease-ms: short, so reclaims come quickly
  std::string log_level = "info";    // --log-level; the soak uses warn
  std::vector<std::string> extra_args;  // e.g. {"--tier", "cuda"}
};

class DaemonProcess {
 public:
  // Starts polykvd and waits up to 20 s for its Admin API to answer.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const DaemonOptions& o) {
    std::unique_ptr<DaemonProcess> d(new DaemonProcess(o));
    auto admin = AdminClient::Connect(o.socket, 20000);
    if (!admin.ok()) return admin.status();
    d->admin_ = *std::move(admin);
    auto stats = d->admin_->GetStats();
    if (!stats.ok()) return stats.status();
    const std::string& a = stats->metrics_address();
    d->metrics_port_ = a.empty() ? -1 : std::stoi(a.substr(a.rfind(':') + 1));
    return d;
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return process_.pid(); }
  const std::string& socket() const { return options_.socket; }
  AdminClient& admin() { return *admin_; }

  absl::StatusOr<v1::Stats> Stats() { return admin_->GetStats(); }
  // The Prometheus page ("" when the scrape fails), read with a 10 s timeout
  // so that a blocked exporter fails the test instead of hanging it.
  std::string Metrics() { return HttpGet(metrics_port_, "/metrics", 10000); }
  // polykvctl --socket <socket> args...: {exit code, stdout}.
  std::pair<int, std::string> Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {BinDir() + "/polykvctl", "--socket", options_.socket});
    return RunProgram(std::move(args));
  }
  // VmRSS of polykvd in bytes, from /proc/<pid>/status; 0 when unreadable.
  uint64_t RssBytes() const { return StatusKib("VmRSS:") * 1024; }
  uint64_t RssAnonBytes() const { return StatusKib("RssAnon:") * 1024; }
  // Open file descriptors of polykvd (sockets, arena memfds, pidfds).
  uint64_t NumFds() const {
    std::error_code ec;
    uint64_t n = 0;
    for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid()) + "/fd", ec), end;
         !ec && it != end; it.increment(ec)) {
      ++n;
    }
    return n;
  }

  // Sends `sig` and waits for the exit: the exit code, or 128 + signal.
  int Stop(int sig = SIGTERM) {
    admin_.reset();
    process_.Signal(sig);
    return process_.Wait();
  }

 private:
  explicit DaemonProcess(const DaemonOptions& o)
      : options_(o), process_(Argv(o)) {}

  static std::vector<std::string> Argv(const DaemonOptions& o) {
    std::vector<std::string> argv = {BinDir() + "/polykvd", "--socket", o.socket,
                                     "--metrics-address", "127.0.0.1:0", "--pool-bytes",
                                     o.pool_bytes, "--arena-bytes", o.arena_bytes, "--lease-ms",
                                     std::to_string(o.lease_ms), "--log-level", o.log_level,
                                     "--check-invariants-on-scrape"};
    argv.insert(argv.end(), o.extra_args.begin(), o.extra_args.end());
    return argv;
  }

  uint64_t StatusKib(const std::string& key) const {
    std::ifstream in("/proc/" + std::to_string(pid()) + "/status");
    std::string word;
    while (in >> word) {
      if (word == key) {
        uint64_t kib = 0;
        in >> kib;
        return kib;
      }
    }
    return 0;
  }

  const DaemonOptions options_;
  Subprocess process_;
  std::unique_ptr<AdminClient> admin_;
  int metrics_port_ = -1;
};

// The accounting check every fault and soak test ends with, once all its
// sessions are closed or reclaimed: the Admin API, polykvctl and the metrics
// page all say no sessions, no used bytes, no pages, nothing pending or
// quarantined, and the pool's invariant check passes. Returns what differs
// ("" when all agree).
inline std::string PoolEmptyAndExact(DaemonProcess& d) {
  std::string problems;
  auto s = d.Stats();
  if (!s.ok()) return absl::StrCat("GetStats: ", s.status().ToString());
  if (s->num_sessions() != 0) absl::StrAppend(&problems, s->num_sessions(), " sessions open; ");
  if (s->pool().used_bytes() != 0) {
    absl::StrAppend(&problems, s->pool().used_bytes(), " bytes used; ");
  }
  if (s->pool().num_pages() != 0) absl::StrAppend(&problems, s->pool().num_pages(), " pages; ");
  auto [code, json] = d.Ctl({"status", "--json"});
  if (code != 0 || Field(json, "used_bytes") != "0" || Field(json, "sessions") != "[]") {
    absl::StrAppend(&problems, "polykvctl status --json: ", json, "; ");
  }
  const std::string page = d.Metrics();
  if (Sample(page, "polykv_pool_invariants_ok") != 1) {
    absl::StrAppend(&problems, "polykv_pool_invariants_ok is ",
                    Sample(page, "polykv_pool_invariants_ok"), "; ");
  }
  if (Sample(page, "polykv_quarantined_bytes") != 0) {
    absl::StrAppend(&problems, "polykv_quarantined_bytes is ",
                    Sample(page, "polykv_quarantined_bytes"), "; ");
  }
  if (Sample(page, "polykv_pending_bytes") != 0) {
    absl::StrAppend(&problems, "polykv_pending_bytes is ", Sample(page, "polykv_pending_bytes"),
                    "; ");
  }
  if (SampleSum(page, "polykv_pages") != 0) {
    absl::StrAppend(&problems, "polykv_pages sum to ", SampleSum(page, "polykv_pages"), "; ");
  }
  return problems;
}

// PoolEmptyAndExact once the pool looks empty to the Admin API (no sessions,
// no used bytes), waiting up to `deadline_ms` for that: the pages of a
// reclaimed session whose worker is dead are freed at a reaper sweep after
// the lease, not with it.
inline std::string WaitForPoolEmptyAndExact(DaemonProcess& d, int deadline_ms = 30000) {
  WaitUntil(
      [&] {
        auto s = d.Stats();
        return s.ok() && s->num_sessions() == 0 && s->pool().used_bytes() == 0;
      },
      std::chrono::milliseconds(deadline_ms));
  return PoolEmptyAndExact(d);
}

}  // namespace polykv::testing
