// Capacity on a live polykvd: how many agent sessions one fixed pool admits
// when each session holds what a cache strategy needs. The evaluation
// (bench/eval) measures how many tokens, in which formats, a strategy keeps at
// a given answer quality; this bench turns those per-session sizes into
// sessions actually admitted by the daemon's allocator — page rounding,
// superblocks and arenas included — instead of pool / bytes arithmetic.
//
//   polykv-bench capacity [--json] [--pool-mib 512]
//       [--session NAME=TOKENS:KFMT:VFMT ...]   (default: static 8192 f16,
//        paged 2600 f16, compressed 700 int4/int4)
//       [--layers 30 --kv-heads 3 --head-dim 64]  (SmolLM2-135M)
//
// Each strategy gets a fresh in-process polykvd (host tier, metrics off) with
// the same pool; sessions (one agent each) open and reserve their tokens until
// the daemon refuses; the count is the capacity.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "daemon/daemon.h"
#include "polykv/client.h"

namespace polykv::bench {
namespace {

struct Strategy {
  std::string name;
  uint64_t tokens = 0;
  PageFormat k = PageFormat::kF16, v = PageFormat::kF16;
};

absl::StatusOr<Strategy> ParseStrategy(const std::string& text) {
  // NAME=TOKENS:KFMT:VFMT
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("--session ", text, ": expected NAME=TOKENS:KFMT:VFMT, e.g. paged=2600:f16:f16"));
  };
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return bad();
  std::vector<std::string> parts = absl::StrSplit(text.substr(eq + 1), ':');
  Strategy s;
  s.name = text.substr(0, eq);
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &s.tokens) || s.tokens == 0) return bad();
  auto k = kernels::ParseFormat(parts[1]), v = kernels::ParseFormat(parts[2]);
  if (!k || !v) return bad();
  s.k = *k;
  s.v = *v;
  return s;
}

struct Result {
  int admitted = 0;
  uint64_t session_bytes = 0;  // page bytes one session holds
  std::string refusal;
};

absl::StatusOr<Result> Measure(const Strategy& st, uint64_t pool_bytes, const ModelProfile& profile) {
  char tmpl[] = "/tmp/polykv-bench-capacity-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  daemon::DaemonConfig cfg;
  cfg.socket = dir + "/d.sock";
  cfg.metrics_address = "off";
  cfg.pool_bytes = pool_bytes;
  cfg.log_level = "warn";
  auto d = daemon::Daemon::Create(cfg);
  if (!d.ok()) return d.status();
  if (absl::Status s = (*d)->Start(); !s.ok()) return s;
  Result r;
  {
    auto client = Client::Connect(cfg.socket);
    if (!client.ok()) return client.status();
    std::vector<std::unique_ptr<Session>> sessions;
    for (int i = 0; i < 1 << 20; ++i) {
      SessionOptions o;
      o.agent_id = absl::StrCat("agent-", i);
      o.profile = profile;
      o.key_format = st.k;
      o.value_format = st.v;
      o.heartbeat = false;
      o.lease_ms = 600000;
      auto s = (*client)->OpenSession(o);
      if (!s.ok()) {
        r.refusal = std::string(s.status().message());
        break;
      }
      auto blocks = (*s)->Reserve(st.tokens);
      if (!blocks.ok()) {
        r.refusal = std::string(blocks.status().message());
        break;
      }
      if (i == 0) {
        r.session_bytes = (blocks->size()) *
                          uint64_t{profile.num_layers} *
                          ((*s)->info().key_page_bytes + uint64_t{(*s)->info().value_page_bytes});
      }
      sessions.push_back(std::move(*s));
      if (i % 64 == 0) std::fprintf(stderr, "\rcapacity %s: %d sessions", st.name.c_str(), i + 1);
    }
    r.admitted = static_cast<int>(sessions.size());
    std::fprintf(stderr, "\rcapacity %s: %d sessions admitted\n", st.name.c_str(), r.admitted);
  }
  (*d)->Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return r;
}

int CapacityMain(int argc, char** argv) {
  bool json = false;
  uint64_t pool_mib = 512;
  ModelProfile profile{30, 3, 64, DType::kF16, "SmolLM2-135M-Instruct"};
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "capacity: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    const auto num = [&](uint32_t* out) {
      const std::string v = next();
      if (!absl::SimpleAtoi(v, out) || *out == 0) {
        std::fprintf(stderr, "capacity: %s: not a positive number: %s\n", a.c_str(), v.c_str());
        std::exit(2);
      }
    };
    if (a == "--json") {
      json = true;
    } else if (a == "--pool-mib") {
      uint32_t v = 0;
      num(&v);
      pool_mib = v;
    } else if (a == "--session") {
      specs.push_back(next());
    } else if (a == "--layers") {
      num(&profile.num_layers);
    } else if (a == "--kv-heads") {
      num(&profile.num_kv_heads);
    } else if (a == "--head-dim") {
      num(&profile.head_dim);
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "polykv-bench capacity [--json] [--pool-mib 512] [--session NAME=TOKENS:KFMT:VFMT ...]\n"
          "    [--layers 30 --kv-heads 3 --head-dim 64]\n"
          "Sessions one pool admits per strategy, each strategy on a fresh in-process polykvd.\n"
          "Formats: %s. Default strategies: static=8192:f16:f16,\n"
          "paged=2600:f16:f16, compressed=700:int4:int4.\n",
          kernels::FormatShortNames().c_str());
      return 0;
    } else {
      std::fprintf(stderr, "capacity: unknown argument %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (specs.empty()) specs = {"static=8192:f16:f16", "paged=2600:f16:f16", "compressed=700:int4:int4"};
  std::vector<Strategy> strategies;
  for (const auto& s : specs) {
    auto st = ParseStrategy(s);
    if (!st.ok()) {
      std::fprintf(stderr, "capacity: %s\n", std::string(st.status().message()).c_str());
      return 2;
    }
    strategies.push_back(*st);
  }
  const uint64_t pool_bytes = pool_mib << 20;
  Json out = {{"bench", "capacity"},
              {"pool_bytes", pool_bytes},
              {"profile",
               {{"layers", profile.num_layers},
                {"kv_heads", profile.num_kv_heads},
                {"head_dim", profile.head_dim}}},
              {"strategies", Json::array()}};
  if (!json) std::printf("%-28s %8s %14s %10s %12s\n", "STRATEGY", "TOKENS", "SESSION BYTES", "ADMITTED", "POOL/BYTES");
  for (size_t i = 0; i < strategies.size(); ++i) {
    const Strategy& st = strategies[i];
    auto r = Measure(st, pool_bytes, profile);
    if (!r.ok()) {
      std::fprintf(stderr, "capacity %s: %s\n", st.name.c_str(), std::string(r.status().message()).c_str());
      return 1;
    }
    const double ideal = r->session_bytes ? static_cast<double>(pool_bytes) / r->session_bytes : 0;
    if (!json) {
      std::printf("%-28s %8llu %14llu %10d %12.1f\n", st.name.c_str(),
                  static_cast<unsigned long long>(st.tokens),
                  static_cast<unsigned long long>(r->session_bytes), r->admitted, ideal);
    }
    out["strategies"].push_back({{"name", st.name},
                                 {"tokens", st.tokens},
                                 {"session_bytes", r->session_bytes},
                                 {"admitted", r->admitted},
                                 {"pool_over_session_bytes", Round(ideal, 2)}});
  }
  if (json) PrintJson(out);
  return 0;
}

}  // namespace

POLYKV_BENCH(capacity, "sessions one pool admits per cache strategy (live in-process polykvd)",
             CapacityMain);

}  // namespace polykv::bench
