// polykv-bench worker: prefill and decode tokens/s of the reference worker
// (SmolLM2-135M by default, OpenBLAS) with its KV cache in process memory
// (--local-cache, the baseline) versus in pages: polykvd's pool when --daemon
// is given, and process-memory pages (the same paged store and kernels,
// without the daemon) always; pool-bare is the pool without the policy
// signals (structure tags, prefill attention mass, the intent probe). Stores
// run interleaved, round after round (in reverse order on odd rounds), in one
// process, and the ratios are medians of the same run.
//
// The signals' cost is measured twice: as the A/B of pool over pool-bare
// (the ratio of the medians, and the median of the per-round ratios of the
// pair run side by side), and directly, as the share of each round's decode
// (prefill) wall time that the store spent in the signal code paths
// (PagedKvStore::signal_cost: tags, attention-mass sums and reports; the
// intent probe, run by pool between prefill and decode as polykv-worker does
// at a message start, counted against the prefill). The share is a ratio of
// two times of the same round, so load on the machine moves both alike.
//
// Beside it, the anchor: llama.cpp (bench/anchor/llamacpp_bench.py in the
// bench-only venv of scripts/setup-bench-venv.sh) on the same GGUF, thread
// count, prompt token ids, decode count and rounds, run as a subprocess after
// the worker's rounds; and the worker's peak RSS against the bound
// GGUF bytes + KV bytes + 300 MiB. docs/worker-performance.md has the method.
//
//   polykv-bench worker [--json] [--daemon SOCKET] [--prompt-tokens 256]
//                       [--decode-tokens 64] [--rounds 3] [--threads N]
//                       [--key-format f32] [--value-format f32] [--model NAME|PATH]
//                       [--intent TEXT] [--anchor auto|off|PYTHON] [--anchor-script PATH]
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "client/worker/conversation.h"
#include "client/worker/clock.h"
#include "client/worker/kv_store.h"
#include "client/worker/paged_kv_store.h"
#include "client/worker/sampler.h"
#include "daemon/daemon.h"
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
  // The pool store's intent probe before each decode ("": none).
  std::string intent = "Where does the daemon keep the KV memory of the workers?";
  // "auto": the bench venv's python if present, else no anchor (with the
  // reason); "off"; or the python interpreter to run the anchor with.
  std::string anchor = "auto";
  std::string anchor_script = POLYKV_SOURCE_DIR "/bench/anchor/llamacpp_bench.py";
};

constexpr int64_t kRssSlackBytes = 300ll << 20;  // The bound's allowance beyond GGUF + KV.

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Kind {
  std::string name;
  std::vector<double> prefill_tps, decode_tps;
  // Paged stores, per round: signal seconds (PagedKvStore::signal_cost) over
  // the round's decode and prefill wall seconds; the probe's over the prefill's.
  std::vector<double> decode_share, prefill_share, probe_share;
  std::vector<double> tag_decode_share, mass_decode_share;
  std::vector<double> commit_decode_share;  // Not a signal: PageSource::Commit, whole.
  worker::SignalCost cost;  // Summed over rounds.
  bool paged = false;
  int block_tokens = 0;  // Paged stores: the source's.
  int64_t kv_bytes = 0;
  int64_t peak_rss_bytes = 0;  // Max over rounds of VmHWM during this store's runs.
  std::string store_name;
};

// Fields of /proc/self/status in bytes ("VmHWM", "VmRSS", "RssAnon", ...);
// those absent (not Linux) are missing from the map.
std::map<std::string, int64_t> ProcStatus() {
  std::map<std::string, int64_t> out;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.find(" kB") == std::string::npos) continue;
    out[line.substr(0, colon)] = std::atoll(line.c_str() + colon + 1) * 1024;
  }
  return out;
}

// Resets VmHWM to the current RSS (Linux >= 4.0), so that the next reading is
// the peak of what ran in between. False where the kernel refuses.
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// What the anchor gave: its JSON object, or why there is none.
struct Anchor {
  Json json;           // The anchor's JSON object; null when there is no anchor.
  std::string reason;  // Why json is null.
  double prefill_tps = 0, decode_tps = 0;
};

// The number at `key` of the object `j`; 0 if absent or not a number.
double NumberOr0(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0;
}

// Runs the llama.cpp anchor on the same GGUF, threads, prompt ids, decode
// count and rounds. Its progress goes to our stderr; its stdout's last line
// is its JSON.
Anchor RunAnchor(const Options& o, const std::string& model_path, int threads,
                 const std::vector<int32_t>& prompt) {
  Anchor a;
  std::string python = o.anchor;
  if (o.anchor == "off") {
    a.reason = "--anchor off";
    return a;
  }
  if (o.anchor == "auto") {
    const char* venv = std::getenv("POLYKV_BENCH_VENV");
    const char* home = std::getenv("HOME");
    python = (venv && *venv ? std::string(venv)
                            : std::string(home ? home : "") + "/.cache/polykv/bench-venv") +
             "/bin/python";
    if (access(python.c_str(), X_OK) != 0) {
      a.reason = "no bench venv (" + python +
                 " is missing): run scripts/setup-bench-venv.sh (builds llama-cpp-python "
                 "from source, ~10+ min), or pass --anchor PYTHON";
      return a;
    }
  }
  if (access(o.anchor_script.c_str(), R_OK) != 0) {
    a.reason = "anchor script " + o.anchor_script + " not found (pass --anchor-script PATH)";
    return a;
  }
  char tmpl[] = "/tmp/polykv-bench-anchor-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) {
    a.reason = std::string("mkstemp: ") + std::strerror(errno);
    return a;
  }
  std::string ids;
  for (int32_t t : prompt) ids += std::to_string(t) + "\n";
  const bool wrote = write(fd, ids.data(), ids.size()) == static_cast<ssize_t>(ids.size());
  close(fd);
  const std::string cmd =
      ShellQuote(python) + " " + ShellQuote(o.anchor_script) + " --model " +
      ShellQuote(model_path) + " --threads " + std::to_string(threads) + " --prompt-tokens " +
      std::to_string(prompt.size()) + " --decode-tokens " + std::to_string(o.decode_tokens) +
      " --rounds " + std::to_string(o.rounds) + " --prompt-ids " + ShellQuote(tmpl);
  std::fprintf(stderr, "anchor: %s\n", cmd.c_str());
  std::string out;
  int status = -1;
  if (wrote) {
    std::fflush(stderr);
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
      status = pclose(p);
    }
  }
  unlink(tmpl);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  const size_t nl = out.rfind('\n');
  const std::string last = nl == std::string::npos ? out : out.substr(nl + 1);
  Json parsed = Json::parse(last, nullptr, /*allow_exceptions=*/false);
  if (!wrote || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      !parsed.is_object()) {
    a.reason = "the anchor failed (exit status " +
               std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + "; its stderr is above): " + cmd;
    return a;
  }
  a.prefill_tps = NumberOr0(parsed, "prefill_tokens_per_s");
  a.decode_tps = NumberOr0(parsed, "decode_tokens_per_s");
  a.json = std::move(parsed);
  return a;
}

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
    po.key_format = *kf;
    po.value_format = *vf;
    if (kind == "pool") {  // what polykv-worker runs: tags reported with every commit
      po.token_text = [tok = m.tokenizer.get()](int32_t id) { return tok->TokenText(id); };
    }
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
  po.prefill_attention_mass = kind != "pool-bare";
  auto s = worker::PagedKvStore::Create(po, std::move(src));
  if (!s.ok()) return s.status();
  return std::unique_ptr<KvStore>(std::move(*s));
}

// What the store cannot time: the attention kernels' own work for the slot
// mass (the softmax weights written per slot, then summed per KV head), paid
// by pool and pool-bare alike in decode, and by pool in prefill. Measured
// apart, on pages of the run's shape and formats (heap pages: the kernels'
// work does not depend on the values), the kernel with and without
// slot_mass alternating in batches, the median of the paired differences
// taken; in seconds per model step (all layers).
struct KernelMass {
  double decode_step_seconds = 0;    // one decode step at the decode's mean length
  double prefill_seconds = 0;        // the whole prompt's chunks
  double decode_step_attention = 0;  // the same step's attention without mass
};

absl::StatusOr<KernelMass> TimeKernelMass(const worker::ModelConfig& cfg, const Options& o,
                                          int block_tokens) {
  auto kf = kernels::ParseFormat(o.key_format);
  auto vf = kernels::ParseFormat(o.value_format);
  if (!kf || !vf) return absl::InvalidArgumentError("unknown --key-format/--value-format");
  worker::HeapPageSourceOptions ho;
  ho.shape = worker::KvShape{1, cfg.num_kv_heads, cfg.head_dim};  // one layer stands for each
  ho.block_tokens = block_tokens;
  ho.k_format = *kf;
  ho.v_format = *vf;
  auto src = worker::NewHeapPageSource(ho);
  if (!src.ok()) return src.status();
  const int max_tokens = o.prompt_tokens + o.decode_tokens;
  auto blocks = (*src)->Reserve(max_tokens);
  if (!blocks.ok()) return blocks.status();
  std::vector<kernels::BlockEntry> table;
  for (const worker::PagedBlock& b : *blocks) {
    kernels::BlockEntry e;
    e.k_offset = reinterpret_cast<uintptr_t>(b.k_pages[0]);
    e.v_offset = reinterpret_cast<uintptr_t>(b.v_pages[0]);
    e.k_format = b.k_format;
    e.v_format = b.v_format;
    table.push_back(e);
  }
  kernels::Exec exec;
  exec.num_threads = o.threads;
  const int hq = cfg.num_heads, kvh = cfg.num_kv_heads, hd = cfg.head_dim;
  const size_t qn = static_cast<size_t>(std::max(o.chunk, 1)) * hq * hd;
  std::vector<float> q(qn), out(qn), mass(static_cast<size_t>(kvh) * max_tokens);
  for (size_t i = 0; i < qn; ++i) q[i] = static_cast<float>((i * 2654435761u) % 1000) / 500 - 1;
  auto view = [&](int tokens) {
    kernels::PagedKvView v;
    v.shape = {block_tokens, kvh, hd};
    v.blocks = table.data();
    v.num_tokens = tokens;
    v.num_blocks = (tokens + block_tokens - 1) / block_tokens;
    return v;
  };
  kernels::AttentionParams params;
  params.num_q_heads = hq;
  // Seconds of `f(with_mass)`, the two alternating in batches of `reps`, for
  // at least `budget` seconds: the median with-minus-without difference and
  // the median without.
  auto paired = [&](const std::function<absl::Status(bool)>& f, int reps,
                    double budget) -> absl::StatusOr<std::pair<double, double>> {
    std::vector<double> diff, bare;
    const double end = worker::SteadySeconds() + budget;
    for (int round = 0; round < 5 || worker::SteadySeconds() < end; ++round) {
      double t[2];
      for (int with : {round % 2, 1 - round % 2}) {
        const double t0 = worker::SteadySeconds();
        for (int r = 0; r < reps; ++r) {
          if (absl::Status st = f(with != 0); !st.ok()) return st;
        }
        t[with] = (worker::SteadySeconds() - t0) / reps;
      }
      diff.push_back(t[1] - t[0]);
      bare.push_back(t[0]);
    }
    return std::pair{Median(diff), Median(bare)};
  };
  KernelMass km;
  const int decode_tokens = o.prompt_tokens + o.decode_tokens / 2;
  auto d = paired(
      [&](bool with) {
        return kernels::PagedDecodeAttention(exec, view(decode_tokens), params, q.data(),
                                             out.data(), nullptr, with ? mass.data() : nullptr);
      },
      20, 1.0);
  if (!d.ok()) return d.status();
  km.decode_step_seconds = d->first * cfg.num_layers;
  km.decode_step_attention = d->second * cfg.num_layers;
  for (int done = 0; done < o.prompt_tokens; done += o.chunk) {
    const int n = std::min(o.chunk, o.prompt_tokens - done);
    auto p = paired(
        [&](bool with) {
          return kernels::PagedPrefillAttention(exec, view(done + n), params, n, q.data(),
                                                out.data(), nullptr, with ? mass.data() : nullptr);
        },
        2, 0.3);
    if (!p.ok()) return p.status();
    km.prefill_seconds += p->first * cfg.num_layers;
  }
  return km;
}

// One message: the prompt prefilled in chunks, then (as a new turn starts)
// the intent probe when `probe`, then decode_tokens decoded.
absl::Status RunOnce(const worker::LoadedModel& m, const std::vector<int32_t>& prompt,
                     const Options& o, bool probe, KvStore* store, Kind* k) {
  std::vector<worker::StepToken> metas;
  for (size_t i = 0; i < prompt.size(); ++i) {
    metas.push_back({prompt[i], static_cast<int32_t>(i), 0, worker::Role::kUser});
  }
  std::vector<float> logits;
  double t0 = worker::SteadySeconds();
  for (size_t i = 0; i < metas.size(); i += o.chunk) {
    const size_t n = std::min(metas.size() - i, static_cast<size_t>(o.chunk));
    if (auto s = m.model->Forward(std::span(metas).subspan(i, n), store, &logits); !s.ok()) return s;
  }
  const double prefill_seconds = worker::SteadySeconds() - t0;
  k->prefill_tps.push_back(prompt.size() / prefill_seconds);
  int32_t pos = static_cast<int32_t>(prompt.size());
  // The answer is a new message, as in Conversation::Generate: BeginTurn, then
  // its intent probed over the cache; neither is in the prefill or decode time.
  const int32_t turn = 1;
  if (auto s = store->BeginTurn(worker::TurnInfo{turn, worker::Role::kAssistant, o.intent});
      !s.ok()) {
    return s;
  }
  if (probe && store->SupportsProbe(worker::ProbeKind::kIntent) && !o.intent.empty()) {
    std::vector<worker::StepToken> intent;
    for (int32_t id : m.tokenizer->Encode(o.intent, false)) {
      const int32_t p = pos + static_cast<int32_t>(intent.size());
      intent.push_back({id, p, turn, worker::Role::kAssistant});
    }
    std::vector<float> probe_logits;
    if (auto s = store->BeginProbe(worker::ProbeKind::kIntent); !s.ok()) return s;
    absl::Status forward = m.model->Forward(intent, store, &probe_logits);
    absl::Status end = store->EndProbe();
    if (!forward.ok()) return forward;
    if (!end.ok()) return end;
  }
  t0 = worker::SteadySeconds();
  for (int i = 0; i < o.decode_tokens; ++i) {
    const worker::StepToken t{worker::Argmax(logits), pos++, turn, worker::Role::kAssistant};
    if (auto s = m.model->Forward(std::span(&t, 1), store, &logits); !s.ok()) return s;
  }
  const double decode_seconds = worker::SteadySeconds() - t0;
  k->decode_tps.push_back(o.decode_tokens / decode_seconds);
  // The store is new each round: its signal cost is this round's.
  if (const auto* paged = dynamic_cast<const worker::PagedKvStore*>(store)) {
    const worker::SignalCost& c = paged->signal_cost();
    k->paged = true;
    k->block_tokens = paged->source()->block_tokens();
    k->decode_share.push_back(c.decode.seconds() / decode_seconds);
    k->tag_decode_share.push_back(c.decode.tag_seconds / decode_seconds);
    k->mass_decode_share.push_back(c.decode.mass_seconds / decode_seconds);
    k->commit_decode_share.push_back(c.decode.commit_seconds / decode_seconds);
    k->prefill_share.push_back(c.prefill.seconds() / prefill_seconds);
    k->probe_share.push_back(c.probe_seconds / prefill_seconds);
    for (auto [sum, add] : {std::pair{&k->cost.decode, &c.decode},
                            std::pair{&k->cost.prefill, &c.prefill}}) {
      sum->tag_seconds += add->tag_seconds;
      sum->mass_seconds += add->mass_seconds;
      sum->calls += add->calls;
      sum->commit_seconds += add->commit_seconds;
    }
    k->cost.probe_seconds += c.probe_seconds;
    k->cost.probes += c.probes;
  }
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
    else if (a == "--intent") o.intent = next();
    else if (a == "--anchor") o.anchor = next();
    else if (a == "--anchor-script") o.anchor_script = next();
    else if (a == "--help" || a == "-h") {
      std::printf("polykv-bench worker [--json] [--daemon SOCKET] [--prompt-tokens N] "
                  "[--decode-tokens N] [--rounds R] [--threads N] [--chunk N] "
                  "[--key-format F] [--value-format F] [--model NAME|PATH] [--intent TEXT] "
                  "[--anchor auto|off|PYTHON] [--anchor-script PATH]\n"
                  "Prefill and decode tokens/s with the KV cache in process memory "
                  "(local), in process-memory pages (pages) and in polykvd's pool (pool: "
                  "the daemon at --daemon SOCKET, else one started in this process, "
                  "reporting structure tags and prefill attention mass and probing --intent "
                  "before decode as polykv-worker does; pool-bare: none of these); "
                  "ratios vs local from one interleaved run. The signals' cost: pool over "
                  "pool-bare (ratio of medians, and median of per-round paired ratios), and "
                  "the share of pool's own decode and prefill time spent in the signal code "
                  "paths (signals_decode_share, signals_prefill_share, intent_probe_share). "
                  "Then llama.cpp on the same "
                  "GGUF, threads and prompt ids (--anchor auto: the venv of "
                  "scripts/setup-bench-venv.sh if present), and the worker's peak RSS "
                  "against GGUF + KV + 300 MiB.\n"
                  "--model: smollm2-135m (default), qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, "
                  "or a .gguf path.\n");
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
  if (auto path = worker::ModelPath(o.model); path.ok()) {
    o.model = *path;
  } else {
    std::fprintf(stderr, "worker bench: --model: %s\n", std::string(path.status().message()).c_str());
    return 2;
  }
  struct stat st;
  if (stat(o.model.c_str(), &st) != 0) {
    std::fprintf(stderr,
                 "worker bench: model file %s: %s (scripts/fetch-model.sh NAME fetches "
                 "smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b)\n",
                 o.model.c_str(), std::strerror(errno));
    return 1;
  }
  const int64_t gguf_bytes = st.st_size;
  // One thread count for both engines: the worker's weight products and
  // attention kernels, and llama.cpp's n_threads / n_threads_batch.
  const int threads =
      o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  o.threads = threads;
  worker::ModelLoadOptions load;
  load.threads = threads;
  auto m = worker::LoadModel(o.model, load);
  if (!m.ok()) {
    std::fprintf(stderr,
                 "worker bench: the reference worker cannot load %s: %s (a GGUF whose "
                 "architecture or tensor types the worker does not support yet fails here; "
                 "llama.cpp alone: ~/.cache/polykv/bench-venv/bin/python "
                 "bench/anchor/llamacpp_bench.py --model %s)\n",
                 o.model.c_str(), std::string(m.status().message()).c_str(), o.model.c_str());
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
  // pool-bare beside pool: what the signals the daemon's policies read cost
  // (structure tags, prefill attention mass); pool-bare reports neither.
  std::vector<std::string> kinds = {"local", "pages", "pool", "pool-bare"};
  std::vector<Kind> results(kinds.size());
  bool peak_per_store = true;
  for (int r = 0; r < o.rounds; ++r) {
    for (size_t i = 0; i < kinds.size(); ++i) {
      // Odd rounds run the stores in reverse: a store that follows another
      // finds the pool's pages already faulted in (and caches warm), so a
      // fixed order biases the pairs measured side by side.
      const size_t k = r % 2 == 0 ? i : kinds.size() - 1 - i;
      results[k].name = kinds[k];
      peak_per_store = ResetPeakRss() && peak_per_store;
      auto store = MakeStore(kinds[k], o, **m);
      if (!store.ok()) {
        std::fprintf(stderr, "worker bench: %s store: %s\n", kinds[k].c_str(),
                     std::string(store.status().message()).c_str());
        return 1;
      }
      const bool probe = kinds[k] == "pool";  // pool-bare probes no intent
      if (auto s = RunOnce(**m, prompt, o, probe, store->get(), &results[k]); !s.ok()) {
        std::fprintf(stderr, "worker bench: %s: %s\n", kinds[k].c_str(),
                     std::string(s.message()).c_str());
        return 1;
      }
      results[k].peak_rss_bytes = std::max(results[k].peak_rss_bytes, ProcStatus()["VmHWM"]);
      std::fprintf(stderr, "round %d %-11s prefill %7.1f tok/s  decode %6.1f tok/s", r,
                   kinds[k].c_str(), results[k].prefill_tps.back(), results[k].decode_tps.back());
      if (results[k].paged) {
        std::fprintf(stderr, "  signals: decode %.3f%% (tags %.3f%%, mass %.3f%%), prefill %.3f%%, "
                     "probe %.3f%%", 100 * results[k].decode_share.back(),
                     100 * results[k].tag_decode_share.back(),
                     100 * results[k].mass_decode_share.back(),
                     100 * results[k].prefill_share.back(), 100 * results[k].probe_share.back());
      }
      std::fprintf(stderr, "\n");
    }
  }
  const double lp = Median(results[0].prefill_tps), ld = Median(results[0].decode_tps);
  // The policy signals' cost: pool (kinds[2]) over pool-bare (kinds[3]).
  const Kind& pool = results[2];
  const Kind& bare = results[3];
  const double signals_prefill = Median(pool.prefill_tps) / Median(bare.prefill_tps);
  const double signals_decode = Median(pool.decode_tps) / Median(bare.decode_tps);
  // Paired: the two ran next to each other in every round, so a round's
  // ratio cancels what the machine's load did to that round.
  std::vector<double> paired_prefill, paired_decode;
  for (int r = 0; r < o.rounds; ++r) {
    paired_prefill.push_back(pool.prefill_tps[r] / bare.prefill_tps[r]);
    paired_decode.push_back(pool.decode_tps[r] / bare.decode_tps[r]);
  }
  const double signals_prefill_paired = Median(paired_prefill);
  const double signals_decode_paired = Median(paired_decode);
  // The kernels' part of the attention mass, as shares of pool's median
  // decode step and prompt prefill.
  auto km = TimeKernelMass((*m)->model->config(), o, pool.block_tokens);
  if (!km.ok()) {
    std::fprintf(stderr, "worker bench: kernel mass: %s\n",
                 std::string(km.status().message()).c_str());
    return 1;
  }
  const double kernel_mass_decode_share = km->decode_step_seconds * Median(pool.decode_tps);
  const double kernel_mass_prefill_share =
      km->prefill_seconds * Median(pool.prefill_tps) / o.prompt_tokens;

  // RSS: the peak over the whole run (the max of the per-store peaks, as each
  // store's run resets VmHWM first) against GGUF + the largest store's KV +
  // 300 MiB. The in-process polykvd (without --daemon) is in this process too:
  // its mapping of the pool's pages counts here, beside the worker's.
  std::map<std::string, int64_t> rss = ProcStatus();
  int64_t peak = rss["VmHWM"], kv_max = 0;
  for (const Kind& k : results) {
    peak = std::max(peak, k.peak_rss_bytes);
    kv_max = std::max(kv_max, k.kv_bytes);
  }
  const int64_t bound = gguf_bytes + kv_max + kRssSlackBytes;
  const bool within = peak <= bound;
  const Anchor anchor = RunAnchor(o, o.model, threads, prompt);
  if (o.json) {
    Json out = {{"bench", "worker"},
                {"model", (*m)->model->config().name},
                {"prompt_tokens", o.prompt_tokens},
                {"decode_tokens", o.decode_tokens},
                {"rounds", o.rounds},
                {"key_format", o.key_format},
                {"value_format", o.value_format},
                {"stores", Json::object()}};
    auto rounded = [](const std::vector<double>& v, int digits) {
      Json a = Json::array();
      for (double x : v) a.push_back(Round(x, digits));
      return a;
    };
    for (const Kind& k : results) {
      const double prefill = Median(k.prefill_tps), decode = Median(k.decode_tps);
      out["stores"][k.name] = {{"store", k.store_name},
                               {"prefill_tokens_per_s", Round(prefill, 2)},
                               {"decode_tokens_per_s", Round(decode, 2)},
                               {"kv_bytes", k.kv_bytes},
                               {"prefill_ratio_vs_local", Round(prefill / lp, 4)},
                               {"decode_ratio_vs_local", Round(decode / ld, 4)}};
      if (!k.paged) continue;
      // Medians over rounds of the signal seconds' share of the round's time;
      // the seconds and calls summed over rounds.
      const worker::SignalCost& c = k.cost;
      out["stores"][k.name]["signals"] = {
          {"decode_share", Round(Median(k.decode_share), 6)},
          {"decode_tags_share", Round(Median(k.tag_decode_share), 6)},
          {"decode_mass_share", Round(Median(k.mass_decode_share), 6)},
          {"decode_commit_share", Round(Median(k.commit_decode_share), 6)},
          {"prefill_share", Round(Median(k.prefill_share), 6)},
          {"probe_share", Round(Median(k.probe_share), 6)},
          {"decode_share_per_round", rounded(k.decode_share, 6)},
          {"decode_tag_seconds", Round(c.decode.tag_seconds, 6)},
          {"decode_mass_seconds", Round(c.decode.mass_seconds, 6)},
          {"decode_calls", c.decode.calls},
          {"prefill_tag_seconds", Round(c.prefill.tag_seconds, 6)},
          {"prefill_mass_seconds", Round(c.prefill.mass_seconds, 6)},
          {"prefill_calls", c.prefill.calls},
          {"probe_seconds", Round(c.probe_seconds, 6)},
          {"probes", c.probes}};
    }
    out["signals_decode_ratio"] = Round(signals_decode, 4);
    out["signals_prefill_ratio"] = Round(signals_prefill, 4);
    out["signals_decode_ratio_paired"] = Round(signals_decode_paired, 4);
    out["signals_prefill_ratio_paired"] = Round(signals_prefill_paired, 4);
    out["signals_decode_ratio_per_round"] = rounded(paired_decode, 4);
    out["signals_prefill_ratio_per_round"] = rounded(paired_prefill, 4);
    // pool's own time in the signal code paths (PagedKvStore::signal_cost),
    // medians over rounds; pool-bare's decode share is the decode attention
    // mass that both report.
    out["signals_decode_share"] = Round(Median(pool.decode_share), 6);
    out["signals_decode_share_per_round"] = rounded(pool.decode_share, 6);
    out["signals_decode_share_bare"] = Round(Median(bare.decode_share), 6);
    out["signals_prefill_share"] = Round(Median(pool.prefill_share), 6);
    out["intent_probe_share"] = Round(Median(pool.probe_share), 6);
    out["intent"] = o.intent;
    out["kernel_mass_decode_share"] = Round(kernel_mass_decode_share, 6);
    out["kernel_mass_prefill_share"] = Round(kernel_mass_prefill_share, 6);
    out["kernel_mass"] = {
        {"decode_step_seconds", Round(km->decode_step_seconds, 9)},
        {"decode_step_attention_seconds", Round(km->decode_step_attention, 9)},
        {"decode_tokens_attended", o.prompt_tokens + o.decode_tokens / 2},
        {"prefill_seconds", Round(km->prefill_seconds, 9)},
        {"block_tokens", pool.block_tokens}};
    if (own_daemon) out["daemon"] = "in-process polykvd (host tier)";
    out["model_path"] = o.model;
    out["threads"] = threads;
    Json per_store = Json::object();
    for (const Kind& k : results) per_store[k.name] = k.peak_rss_bytes;
    out["rss"] = {{"peak_bytes", peak},
                  {"peak_per_store", peak_per_store},
                  {"vm_rss_bytes", rss["VmRSS"]},
                  {"rss_anon_bytes", rss["RssAnon"]},
                  {"rss_file_bytes", rss["RssFile"]},
                  {"rss_shmem_bytes", rss["RssShmem"]},
                  {"gguf_bytes", gguf_bytes},
                  {"kv_bytes", kv_max},
                  {"slack_bytes", kRssSlackBytes},
                  {"bound_bytes", bound},
                  {"within_bound", within},
                  {"per_store_peak_bytes", per_store}};
    // The anchor compares with the local store: the worker's own cache.
    if (anchor.json.is_null()) {
      out["anchor"] = nullptr;
      out["anchor_reason"] = anchor.reason;
      out["vs_llama_cpp"] = nullptr;
    } else {
      out["anchor"] = anchor.json;
      out["vs_llama_cpp"] = {
          {"worker_store", "local"},
          {"worker_prefill_tokens_per_s", Round(lp, 2)},
          {"worker_decode_tokens_per_s", Round(ld, 2)},
          {"llama_cpp_prefill_tokens_per_s", Round(anchor.prefill_tps, 2)},
          {"llama_cpp_decode_tokens_per_s", Round(anchor.decode_tps, 2)},
          {"prefill_ratio", Round(anchor.prefill_tps > 0 ? lp / anchor.prefill_tps : 0.0, 4)},
          {"decode_ratio", Round(anchor.decode_tps > 0 ? ld / anchor.decode_tps : 0.0, 4)}};
    }
    PrintJson(out);
  } else {
    for (const Kind& k : results) {
      std::printf("%-11s %-16s prefill %8.1f tok/s (x%.3f)  decode %7.1f tok/s (x%.3f)  kv %lld B"
                  "  peak rss %.1f MiB\n",
                  k.name.c_str(), k.store_name.c_str(), Median(k.prefill_tps),
                  Median(k.prefill_tps) / lp, Median(k.decode_tps), Median(k.decode_tps) / ld,
                  static_cast<long long>(k.kv_bytes), k.peak_rss_bytes / 1048576.0);
    }
    std::printf("policy signals (pool / pool-bare: tags, prefill mass): prefill x%.3f, "
                "decode x%.3f (paired per round: prefill x%.3f, decode x%.3f)\n",
                signals_prefill, signals_decode, signals_prefill_paired, signals_decode_paired);
    std::printf("policy signals (pool's own time in them, median of rounds): decode %.3f%% "
                "(tags %.3f%%, mass %.3f%%; pool-bare %.3f%%; whole commits %.3f%%), prefill "
                "%.3f%%, intent probe %.3f%% of the prefill\n",
                100 * Median(pool.decode_share), 100 * Median(pool.tag_decode_share),
                100 * Median(pool.mass_decode_share), 100 * Median(bare.decode_share),
                100 * Median(pool.commit_decode_share),
                100 * Median(pool.prefill_share), 100 * Median(pool.probe_share));
    std::printf("attention kernels' own slot-mass work (measured apart): decode %.3f%% of a "
                "step (pool and pool-bare), prefill %.3f%% (pool)\n",
                100 * kernel_mass_decode_share, 100 * kernel_mass_prefill_share);
    if (anchor.json.is_null()) {
      std::printf("llama.cpp: none (%s)\n", anchor.reason.c_str());
    } else {
      std::printf("llama.cpp               prefill %8.1f tok/s          decode %7.1f tok/s "
                  "(worker local / llama.cpp: prefill x%.3f, decode x%.3f; %d threads)\n",
                  anchor.prefill_tps, anchor.decode_tps, lp / anchor.prefill_tps,
                  ld / anchor.decode_tps, threads);
    }
    std::printf("rss: peak %.1f MiB %s bound %.1f MiB (GGUF %.1f + KV %.1f + 300 MiB)\n",
                peak / 1048576.0, within ? "<=" : "> (over)", bound / 1048576.0,
                gguf_bytes / 1048576.0, kv_max / 1048576.0);
  }
  if (!anchor.json.is_null() || o.anchor == "auto" || o.anchor == "off") return 0;
  return 1;  // An anchor asked for by --anchor PYTHON that failed.
}

}  // namespace
}  // namespace polykv::bench

POLYKV_BENCH(worker, "reference worker: prefill/decode tokens/s, pool vs --local-cache",
             [](int argc, char** argv) -> int { return polykv::bench::Main(argc, argv); });
