// polykv-bench worker: prefill and decode tokens/s of the reference worker
// (SmolLM2-135M, OpenBLAS) with its KV cache in process memory
// (--local-cache, the baseline) versus in pages: polykvd's pool when --daemon
// is given, and process-memory pages (the same paged store and kernels,
// without the daemon) always. Stores run interleaved, round after round, in
// one process, and the ratios are medians of the same run.
//
//   polykv-bench worker [--json] [--daemon SOCKET] [--prompt-tokens 256]
//                       [--decode-tokens 64] [--rounds 3] [--threads N]
//                       [--key-format f32] [--value-format f32] [--model PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_registry.h"
#include "daemon/daemon.h"
#include "client/worker/conversation.h"
#include "client/worker/kv_store.h"
#include "client/worker/paged_kv_store.h"
#include "client/worker/sampler.h"
#include "kernels/page_format.h"
#if POLYKV_WORKER_WITH_POOL
#include "client/worker/pool_page_source.h"
#endif

namespace polykv::bench {
namespace {

using worker::KvStore;

struct Options {
  bool json = false;
  std::string model;
  std::string daemon;
  int prompt_tokens = 256;
  int decode_tokens = 64;
  int rounds = 3;
  int threads = 0;
  int chunk = 64;
  std::string key_format = "f32";
  std::string value_format = "f32";
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Kind {
  std::string name;
  std::vector<double> prefill_tps, decode_tps;
  int64_t kv_bytes = 0;
  std::string store_name;
};

absl::StatusOr<std::unique_ptr<KvStore>> MakeStore(const std::string& kind, const Options& o,
                                                   const worker::LoadedModel& m) {
  const worker::KvShape shape = m.model->config().kv_shape();
  kernels::Exec exec;
  exec.num_threads = o.threads;
  if (kind == "local") {
    worker::LocalKvStoreOptions lo;
    lo.shape = shape;
    lo.kernel_threads = o.threads;
    auto s = worker::LocalKvStore::Create(lo);
    if (!s.ok()) return s.status();
    return std::unique_ptr<KvStore>(std::move(*s));
  }
  auto kf = kernels::ParseFormat(o.key_format);
  auto vf = kernels::ParseFormat(o.value_format);
  if (!kf || !vf) return absl::InvalidArgumentError("unknown --key-format/--value-format");
  std::unique_ptr<worker::PageSource> src;
  if (kind == "pages") {
    worker::HeapPageSourceOptions ho;
    ho.shape = shape;
    ho.k_format = *kf;
    ho.v_format = *vf;
    auto s = worker::NewHeapPageSource(ho);
    if (!s.ok()) return s.status();
    src = std::move(*s);
  } else {
#if POLYKV_WORKER_WITH_POOL
    worker::PoolPageSourceOptions po;
    po.socket = o.daemon;
    po.agent_id = "bench-worker";
    po.shape = shape;
    po.key_format = static_cast<uint8_t>(*kf);
    po.value_format = static_cast<uint8_t>(*vf);
    auto s = worker::NewPoolPageSource(po);
    if (!s.ok()) return s.status();
    src = std::move(*s);
#else
    return absl::UnimplementedError("built without libpolykv_client");
#endif
  }
  worker::PagedKvStoreOptions po;
  po.shape = shape;
  po.exec = exec;
  auto s = worker::PagedKvStore::Create(po, std::move(src));
  if (!s.ok()) return s.status();
  return std::unique_ptr<KvStore>(std::move(*s));
}

absl::Status RunOnce(const worker::LoadedModel& m, const std::vector<int32_t>& prompt,
                     const Options& o, KvStore* store, Kind* k) {
  std::vector<worker::TokenMeta> metas;
  for (size_t i = 0; i < prompt.size(); ++i) {
    metas.push_back({prompt[i], static_cast<int32_t>(i), 0, worker::Role::kUser});
  }
  std::vector<float> logits;
  double t0 = Now();
  for (size_t i = 0; i < metas.size(); i += o.chunk) {
    const size_t n = std::min(metas.size() - i, static_cast<size_t>(o.chunk));
    if (auto s = m.model->Forward(std::span(metas).subspan(i, n), store, &logits); !s.ok()) return s;
  }
  k->prefill_tps.push_back(prompt.size() / (Now() - t0));
  t0 = Now();
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int i = 0; i < o.decode_tokens; ++i) {
    const worker::TokenMeta t{worker::Argmax(logits), pos++, 1, worker::Role::kAssistant};
    if (auto s = m.model->Forward(std::span(&t, 1), store, &logits); !s.ok()) return s;
  }
  k->decode_tps.push_back(o.decode_tokens / (Now() - t0));
  k->kv_bytes = store->bytes();
  k->store_name = store->name();
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Options o;
  o.model = worker::DefaultModelPath();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "worker bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") o.json = true;
    else if (a == "--model") o.model = next();
    else if (a == "--daemon") o.daemon = next();
    else if (a == "--prompt-tokens") o.prompt_tokens = std::atoi(next());
    else if (a == "--decode-tokens") o.decode_tokens = std::atoi(next());
    else if (a == "--rounds") o.rounds = std::atoi(next());
    else if (a == "--threads") o.threads = std::atoi(next());
    else if (a == "--chunk") o.chunk = std::atoi(next());
    else if (a == "--key-format") o.key_format = next();
    else if (a == "--value-format") o.value_format = next();
    else if (a == "--help" || a == "-h") {
      std::printf("polykv-bench worker [--json] [--daemon SOCKET] [--prompt-tokens N] "
                  "[--decode-tokens N] [--rounds R] [--threads N] [--chunk N] "
                  "[--key-format F] [--value-format F] [--model PATH]\n"
                  "Prefill and decode tokens/s with the KV cache in process memory "
                  "(local), in process-memory pages (pages) and in polykvd's pool (pool: "
                  "the daemon at --daemon SOCKET, else one started in this process); "
                  "ratios vs local from one interleaved run.\n");
      return 0;
    } else {
      std::fprintf(stderr, "worker bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.prompt_tokens < 1 || o.decode_tokens < 1 || o.rounds < 1 || o.chunk < 1) {
    std::fprintf(stderr, "worker bench: counts must be positive\n");
    return 2;
  }
  auto m = worker::LoadModel(o.model);
  if (!m.ok()) {
    std::fprintf(stderr, "worker bench: %s\n", std::string(m.status().message()).c_str());
    return 1;
  }
  std::string text;
  std::vector<int32_t> prompt;
  while (static_cast<int>(prompt.size()) < o.prompt_tokens) {
    text += "The daemon owns the KV memory of every worker on the node. Agents call tools, "
            "read files and plan; their caches grow turn by turn. def f(x): return x * 2\n";
    prompt = (*m)->tokenizer->Encode(text, false);
  }
  prompt.resize(o.prompt_tokens);

  // Without --daemon, run a polykvd in this process (host tier, metrics off)
  // so the pool is always measured beside the local cache.
  std::unique_ptr<daemon::Daemon> own_daemon;
  std::string own_dir;
  if (o.daemon.empty()) {
    char tmpl[] = "/tmp/polykv-bench-worker-XXXXXX";
    own_dir = mkdtemp(tmpl);
    daemon::DaemonConfig cfg;
    cfg.socket = own_dir + "/d.sock";
    cfg.metrics_address = "off";
    cfg.pool_bytes = 1ull << 30;
    auto d = daemon::Daemon::Create(cfg);
    absl::Status started = d.ok() ? (*d)->Start() : d.status();
    if (!started.ok()) {
      std::fprintf(stderr, "worker bench: cannot start an in-process polykvd: %s\n",
                   std::string(started.message()).c_str());
      return 1;
    }
    own_daemon = *std::move(d);
    o.daemon = cfg.socket;
  }
  std::vector<std::string> kinds = {"local", "pages", "pool"};
  std::vector<Kind> results(kinds.size());
  for (int r = 0; r < o.rounds; ++r) {
    for (size_t k = 0; k < kinds.size(); ++k) {
      results[k].name = kinds[k];
      auto store = MakeStore(kinds[k], o, **m);
      if (!store.ok()) {
        std::fprintf(stderr, "worker bench: %s store: %s\n", kinds[k].c_str(),
                     std::string(store.status().message()).c_str());
        return 1;
      }
      if (auto s = RunOnce(**m, prompt, o, store->get(), &results[k]); !s.ok()) {
        std::fprintf(stderr, "worker bench: %s: %s\n", kinds[k].c_str(),
                     std::string(s.message()).c_str());
        return 1;
      }
      std::fprintf(stderr, "round %d %-6s prefill %7.1f tok/s  decode %6.1f tok/s\n", r,
                   kinds[k].c_str(), results[k].prefill_tps.back(), results[k].decode_tps.back());
    }
  }
  const double lp = Median(results[0].prefill_tps), ld = Median(results[0].decode_tps);
  if (o.json) {
    std::string out = "{\"bench\":\"worker\",\"model\":\"" + (*m)->model->config().name +
                      "\",\"prompt_tokens\":" + std::to_string(o.prompt_tokens) +
                      ",\"decode_tokens\":" + std::to_string(o.decode_tokens) +
                      ",\"rounds\":" + std::to_string(o.rounds) + ",\"key_format\":\"" +
                      o.key_format + "\",\"value_format\":\"" + o.value_format + "\",\"stores\":{";
    for (size_t k = 0; k < results.size(); ++k) {
      char buf[512];
      std::snprintf(buf, sizeof(buf),
                    "%s\"%s\":{\"store\":\"%s\",\"prefill_tokens_per_s\":%.2f,"
                    "\"decode_tokens_per_s\":%.2f,\"kv_bytes\":%lld,"
                    "\"prefill_ratio_vs_local\":%.4f,\"decode_ratio_vs_local\":%.4f}",
                    k ? "," : "", results[k].name.c_str(), results[k].store_name.c_str(),
                    Median(results[k].prefill_tps), Median(results[k].decode_tps),
                    static_cast<long long>(results[k].kv_bytes),
                    Median(results[k].prefill_tps) / lp, Median(results[k].decode_tps) / ld);
      out += buf;
    }
    out += "}";
    if (own_daemon) out += ",\"daemon\":\"in-process polykvd (host tier)\"";
    out += "}";
    std::printf("%s\n", out.c_str());
  } else {
    for (const Kind& k : results) {
      std::printf("%-6s %-16s prefill %8.1f tok/s (x%.3f)  decode %7.1f tok/s (x%.3f)  kv %lld B\n",
                  k.name.c_str(), k.store_name.c_str(), Median(k.prefill_tps),
                  Median(k.prefill_tps) / lp, Median(k.decode_tps), Median(k.decode_tps) / ld,
                  static_cast<long long>(k.kv_bytes));
    }
  }
  return 0;
}

}  // namespace
}  // namespace polykv::bench

POLYKV_BENCH(worker, "reference worker: prefill/decode tokens/s, pool vs --local-cache",
             [](int argc, char** argv) -> int { return polykv::bench::Main(argc, argv); });
