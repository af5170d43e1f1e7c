// polykvd: the KV-cache daemon. Flags override the YAML config file.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "daemon/config/config.h"
#include "daemon/daemon.h"
#include "daemon/log.h"
#include "policies/byte_size.h"
#include "policies/policy.h"

namespace {

int Fail(const std::string& what) {
  spdlog::error("{}", what);
  return 1;
}

// One JSON line: what an evaluation or operator tool would otherwise
// re-derive from the policy grammar (bench/eval/live.py reads the trigger).
int DescribePolicy(const std::string& text) {
  auto policy = polykv::policies::MakePolicyFromText(text);
  if (!policy.ok()) return Fail(std::string(policy.status().message()));
  auto quoted = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out + "\"";
  };
  const auto& p = **policy;
  std::string reads;
  for (polykv::policies::ScoreStream s : polykv::policies::AllScoreStreams()) {
    if (!p.Reads().has(s)) continue;
    reads += (reads.empty() ? "" : ",") + quoted(std::string(ScoreStreamName(s)));
  }
  std::printf("{\"policy\":%s,\"spec\":%s,\"trigger\":%.9g,\"reads\":[%s],"
              "\"selects_per_layer\":%s,\"reads_keys\":%s}\n",
              quoted(text).c_str(), quoted(p.spec()).c_str(), p.Trigger(), reads.c_str(),
              p.SelectsPerLayer() ? "true" : "false", p.ReadsKeys() ? "true" : "false");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using polykv::daemon::DaemonConfig;
  CLI::App app{"polykvd — shared KV-cache pool for LLM agents (one per node)"};
  std::string config_file, socket, metrics_address, pool_bytes, arena_bytes, tier, cuda_export,
      log_level, low_watermark;
  uint32_t lease_ms = 0;
  bool print_config = false, check_invariants = false;
  std::string describe_policy;
  std::string peer_address, peer_cert, peer_key, peer_ca;
  std::string offload_host_bytes, offload_dir, offload_disk_bytes;
  uint32_t offload_idle_ms = 0;
  bool ladder_evict_idle = false;
  app.add_option("--config", config_file, "YAML config file (see deploy/polykvd.yaml)");
  app.add_option("--describe-policy", describe_policy,
                 "Print how polykvd runs the policy TEXT (its canonical spec, compaction "
                 "trigger and the score streams it reads) as one JSON line and exit");
  app.add_flag("--print-config", print_config,
               "Print the effective configuration (built-in defaults, then --config, then "
               "flags) as YAML and exit");
  app.add_option("--socket", socket, "Unix socket for the gRPC API [/run/polykv/polykvd.sock]");
  app.add_option("--metrics-address", metrics_address,
                 "Prometheus /metrics HOST:PORT, or 'off' [127.0.0.1:9464]");
  app.add_option("--pool-bytes", pool_bytes, "Pool budget, e.g. 1GiB [1GiB]");
  app.add_option("--arena-bytes", arena_bytes, "Size of each arena, e.g. 64MiB [64MiB]");
  app.add_option("--low-watermark-bytes", low_watermark,
                 "Free bytes below which the pressure ladder acts [pool/10]");
  app.add_option("--tier", tier, "Memory tier: host (shared memory) or cuda [host]");
  app.add_option("--cuda-export", cuda_export,
                 "How a cuda tier's arenas reach workers: fd (CUDA VMM, POSIX fds) or ipc "
                 "(legacy IPC handles) [fd]");
  app.add_option("--lease-ms", lease_ms, "Session lease in milliseconds [5000]");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error [info]");
  app.add_flag("--check-invariants-on-scrape", check_invariants,
               "Debug: check the pool's accounting at every /metrics scrape "
               "(polykv_pool_invariants_ok); holds the pool lock for O(pages)");
  app.add_option("--peer-address", peer_address,
                 "HOST:PORT to take sessions moved from other polykvd (gRPC over mutual TLS) "
                 "[off]");
  app.add_option("--peer-cert", peer_cert, "This daemon's peer certificate (PEM)");
  app.add_option("--peer-key", peer_key, "Its private key (PEM)");
  app.add_option("--peer-ca", peer_ca, "The CA both ends of the peer link trust (PEM)");
  app.add_option("--offload-host-bytes", offload_host_bytes,
                 "Offload tier in polykvd's memory for idle sessions' pages, e.g. 4GiB [0: none]");
  app.add_option("--offload-dir", offload_dir,
                 "Offload tier on disk: a directory of polykvd's own (files of earlier runs are "
                 "removed) [none]");
  app.add_option("--offload-disk-bytes", offload_disk_bytes,
                 "The disk tier's capacity, e.g. 64GiB (with --offload-dir)");
  app.add_option("--offload-idle-ms", offload_idle_ms,
                 "Offload a session idle this long [0: only under pressure or when asked]");
  app.add_flag("--ladder-evict-idle", ladder_evict_idle,
               "Under pressure, evict idle sessions the offload tiers cannot take");
  CLI11_PARSE(app, argc, argv);
  if (!describe_policy.empty()) return DescribePolicy(describe_policy);

  spdlog::set_default_logger(polykv::daemon::DaemonLogger());
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ polykvd: %v");
  DaemonConfig config;
  if (!config_file.empty()) {
    auto loaded = polykv::daemon::LoadConfigFile(config_file, config);
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    config = *loaded;
  }
  if (!socket.empty()) config.socket = socket;
  if (!metrics_address.empty()) config.metrics_address = metrics_address;
  if (!tier.empty()) config.tier = tier;
  if (!cuda_export.empty()) config.cuda_export = cuda_export;
  if (lease_ms) config.lease_ms = lease_ms;
  if (!log_level.empty()) config.log_level = log_level;
  if (check_invariants) config.check_invariants_on_scrape = true;
  for (auto [text, field] : {std::pair{&peer_address, &config.peer.address},
                             std::pair{&peer_cert, &config.peer.cert},
                             std::pair{&peer_key, &config.peer.key},
                             std::pair{&peer_ca, &config.peer.ca}}) {
    if (!text->empty()) *field = *text;
  }
  if (!offload_dir.empty()) config.offload.dir = offload_dir;
  if (offload_idle_ms) config.offload.idle_ms = offload_idle_ms;
  if (ladder_evict_idle) config.ladder_evict_idle = true;
  for (auto [flag, text, field] : {std::tuple{"--pool-bytes", &pool_bytes, &config.pool_bytes},
                                   std::tuple{"--offload-host-bytes", &offload_host_bytes,
                                              &config.offload.host_bytes},
                                   std::tuple{"--offload-disk-bytes", &offload_disk_bytes,
                                              &config.offload.disk_bytes},
                                   std::tuple{"--arena-bytes", &arena_bytes, &config.arena_bytes},
                                   std::tuple{"--low-watermark-bytes", &low_watermark,
                                              &config.low_watermark_bytes}}) {
    if (text->empty()) continue;
    auto b = polykv::policies::ParseByteSize(*text);
    if (!b.ok()) return Fail(std::string(flag) + ": " + std::string(b.status().message()));
    *field = *b;
  }
  if (print_config) {
    if (auto s = polykv::daemon::ValidateConfig(config); !s.ok()) {
      return Fail(std::string(s.message()));
    }
    std::fputs(polykv::daemon::ConfigToYaml(config).c_str(), stdout);
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  // Same-uid processes could otherwise open the arena memfds through
  // /proc/<pid>/fd and bypass the token check of the fd socket.
  prctl(PR_SET_DUMPABLE, 0);

  // Signals are taken synchronously by main; every other thread blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto daemon = polykv::daemon::Daemon::Create(config);
  if (!daemon.ok()) return Fail(std::string(daemon.status().message()));
  if (auto s = (*daemon)->Start(); !s.ok()) return Fail(std::string(s.message()));

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("{} received; draining for up to {} ms", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               config.drain_timeout_ms);
  (*daemon)->Drain(absl::Milliseconds(config.drain_timeout_ms));
  (*daemon)->Shutdown();
  spdlog::info("stopped");
  return 0;
}
