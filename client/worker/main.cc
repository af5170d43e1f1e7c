// polykv-worker: the reference worker. Runs SmolLM2 (any Llama GGUF with a
// ChatML template) as one agent whose KV cache lives either in polykvd's
// pool (--daemon) or in process memory (--local-cache, the baseline).
//
//   polykv-worker run SCRIPT.jsonl --local-cache [--max-new-tokens N] [--seed S]
//   polykv-worker run SCRIPT.jsonl --count-tokens
//   polykv-worker run SCRIPT.jsonl ... --logprobs-out REF.jsonl    (then, on another cache:)
//   polykv-worker run SCRIPT.jsonl ... --teacher-force REF.jsonl   (KL and top-1 vs REF)
//   polykv-worker chat --local-cache
//
// Script: one JSON object per line, {"role": "system"|"user"|"tool"|"assistant",
// "content": "..."}; an assistant line without "content" or "tool_calls"
// generates that turn (optional "max_new_tokens"); any line may carry
// "intent" and "id", a generated one "answer_prefix" (the start of the
// answer, given to the model). An optional first line {"tools": [...]}
// declares tools (client/worker/README.md has the details).
// Output: one JSON line per generated turn on stdout (stable field names;
// fields are only ever added); progress and errors on stderr.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/worker/blas_core.h"
#include "client/worker/chat_tokenizer.h"
#include "client/worker/conversation.h"
#include "client/worker/json.h"
#include "client/worker/kv_store.h"
#include "client/worker/logprobs.h"
#include "client/worker/paged_kv_store.h"
#include "kernels/page_format.h"
#if POLYKV_WORKER_WITH_POOL
#include "client/worker/pool_page_source.h"
#endif

namespace polykv::worker {
namespace {

struct Flags {
  std::string script;
  std::string model;
  std::string daemon;
  std::string agent = "agent-0";
  bool local_cache = false;
  bool local_pages = false;
  std::string tenant = "default";
  std::string key_format;    // Empty: f32 for --local-pages, the daemon's choice for --daemon.
  std::string value_format;
  int block_tokens = 16;
  int recent_f16_tokens = 0;
  bool pages_on_device = false;
  std::string attention = "kernels";
  int max_new_tokens = 128;
  uint64_t seed = 0;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int prefill_chunk = 64;
  bool no_intent_probe = false;
  bool no_reconstruct = false;
  int observation_window = ConversationOptions{}.observation_window;
  int share_prefix_messages = 0;
  int reserve_retry_ms = 30000;
  int threads = 0;
  int64_t max_context = 8192;
  bool summary = false;
  int pause_before_tools_ms = 0;  // run: the agent waits this long for each tool
  bool count_tokens = false;
  std::string logprobs_out;   // Each generated turn's top-k next-token log-probabilities.
  int logprobs_top = 64;
  std::string teacher_force;  // A --logprobs-out file: force and score each turn.
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "polykv-worker: %s\n", std::string(s.message()).c_str());
  return 1;
}

absl::StatusOr<kernels::PageFormat> FormatFlag(const std::string& name, const char* flag) {
  auto f = kernels::ParseFormat(name);
  if (!f.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", name, ": unknown page format (", kernels::FormatShortNames(", "), ")"));
  }
  return *f;
}

ConversationOptions ConversationOptionsOf(const Flags& f) {
  ConversationOptions co;
  co.prefill_chunk = f.prefill_chunk;
  co.intent_probe = !f.no_intent_probe;
  co.reconstruct = !f.no_reconstruct;
  co.observation_window = f.observation_window;
  co.share_prefix = f.share_prefix_messages > 0;
  co.sampler = {f.temperature, f.top_p, f.seed};
  return co;
}

absl::StatusOr<std::unique_ptr<KvStore>> MakeStore(const Flags& f, const LoadedModel& m) {
  const int modes = !f.daemon.empty() + f.local_cache + f.local_pages;
  if (modes != 1) {
    return absl::InvalidArgumentError(
        "choose where the KV cache lives: --daemon SOCKET, --local-cache or --local-pages");
  }
  if (f.local_cache && f.recent_f16_tokens > 0) {
    return absl::InvalidArgumentError(
        "--recent-f16-tokens is for paged caches (--daemon or --local-pages); --local-cache is f32");
  }
  if (f.pages_on_device && f.daemon.empty()) {
    return absl::InvalidArgumentError("--pages-on-device is for --daemon (a cuda-tier polykvd)");
  }
  if (f.share_prefix_messages > 0 && f.daemon.empty()) {
    return absl::InvalidArgumentError(
        "--share-prefix-messages is for --daemon (prefixes are the pool's)");
  }
  const KvShape shape = m.model->config().kv_shape();
  kernels::Exec exec;
  exec.num_threads = f.threads;
  if (f.pages_on_device) exec.backend = kernels::Backend::kCuda;
  if (f.local_cache) {
    LocalKvStoreOptions o;
    o.shape = shape;
    o.max_slots = f.max_context;
    o.kernel_threads = f.threads;
    if (f.attention == "blas") {
      o.attention = LocalAttention::kBlas;
    } else if (f.attention != "kernels") {
      return absl::InvalidArgumentError("--attention must be kernels or blas");
    }
    auto s = LocalKvStore::Create(o);
    if (!s.ok()) return s.status();
    return std::unique_ptr<KvStore>(std::move(*s));
  }
  std::unique_ptr<PageSource> source;
  if (f.local_pages) {
    HeapPageSourceOptions o;
    o.shape = shape;
    o.block_tokens = f.block_tokens;
    o.max_tokens = f.max_context;
    auto kf = FormatFlag(f.key_format.empty() ? "f32" : f.key_format, "--key-format");
    if (!kf.ok()) return kf.status();
    auto vf = FormatFlag(f.value_format.empty() ? "f32" : f.value_format, "--value-format");
    if (!vf.ok()) return vf.status();
    o.k_format = *kf;
    o.v_format = *vf;
    auto s = NewHeapPageSource(o);
    if (!s.ok()) return s.status();
    source = std::move(*s);
  } else {
#if POLYKV_WORKER_WITH_POOL
    PoolPageSourceOptions o;
    o.socket = f.daemon;
    o.agent_id = f.agent;
    o.tenant = f.tenant;
    o.model_id = m.model->config().name;
    o.shape = shape;
    o.block_tokens = f.block_tokens;
    o.pages_on_device = f.pages_on_device;
    o.token_text = [tok = m.tokenizer.get()](int32_t id) { return tok->TokenText(id); };
    if (!f.key_format.empty()) {
      auto kf = FormatFlag(f.key_format, "--key-format");
      if (!kf.ok()) return kf.status();
      o.key_format = *kf;
    }
    if (!f.value_format.empty()) {
      auto vf = FormatFlag(f.value_format, "--value-format");
      if (!vf.ok()) return vf.status();
      o.value_format = *vf;
    }
    auto s = NewPoolPageSource(o);
    if (!s.ok()) {
      return absl::Status(s.status().code(),
                          absl::StrCat("--daemon ", f.daemon, ": ", s.status().message()));
    }
    source = std::move(*s);
#else
    return absl::UnimplementedError(absl::StrCat(
        "--daemon ", f.daemon, ": this polykv-worker was built without libpolykv_client"));
#endif
  }
  PagedKvStoreOptions po;
  po.shape = shape;
  po.exec = exec;
  po.recent_f16_tokens = f.recent_f16_tokens;
  po.share_prefix_messages = f.share_prefix_messages;
  if (!f.daemon.empty()) po.reserve_retry_ms = f.reserve_retry_ms;
  auto s = PagedKvStore::Create(po, std::move(source));
  if (!s.ok()) return s.status();
  return std::unique_ptr<KvStore>(std::move(*s));
}

std::string TurnJson(const Flags& f, const std::string& id, int turn, const TurnResult& r,
                     const std::string& answer_prefix, const KvStore& store,
                     const ForcedSummary* forced) {
  const double pre_tps = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0;
  const double dec_tps = r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0;
  const auto round = [](double x, double unit) { return std::round(x / unit) * unit; };
  JsonValue out = {{"agent", f.agent},
                   {"id", id},
                   {"turn", turn},
                   {"text", r.text},
                   {"tokens", r.tokens},
                   {"prompt_tokens", r.prompt_tokens},
                   {"attached_tokens", r.attached_tokens},
                   {"attach_ms", round(r.attach_seconds * 1e3, 1e-3)},
                   {"completion_tokens", r.completion_tokens},
                   {"cached_tokens", r.cached_tokens},
                   {"prefill_ms", round(r.prefill_seconds * 1e3, 1e-3)},
                   {"decode_ms", round(r.decode_seconds * 1e3, 1e-3)},
                   {"prefill_tokens_per_s", round(pre_tps, 1e-2)},
                   {"decode_tokens_per_s", round(dec_tps, 1e-2)},
                   {"stop", r.stop},
                   {"cache", store.name()},
                   {"kv_bytes", store.bytes()},
                   {"kv_bytes_peak", store.peak_bytes()},
                   {"epoch", store.epoch()}};
  if (store.block_tokens() > 0) out["block_tokens"] = store.block_tokens();
  // When the daemon can compact: what bench/eval/live.py checks compactions by.
  if (const KvStore::SyncCadence c = store.sync_cadence(); c.steps > 0) {
    out["sync_every_steps"] = c.steps;
    out["sync_every_tokens"] = c.tokens;
  }
  if (f.recent_f16_tokens > 0) out["recent_f16_tokens"] = f.recent_f16_tokens;
  if (!answer_prefix.empty()) out["answer_prefix"] = answer_prefix;
  if (forced != nullptr) {
    out.update({{"forced", true},
                {"forced_positions", forced->positions},
                {"kl_mean", round(forced->kl_mean(), 1e-7)},
                {"kl_max", round(forced->kl_max, 1e-7)},
                {"top1_agreement", round(forced->top1_agreement(), 1e-6)},
                {"target_logprob_mean", round(forced->target_logprob_mean(), 1e-6)}});
  }
  return DumpJson(out);
}

// --count-tokens: the number of tokens of the rendered conversation before
// `chat`'s next message, i.e. its length if it were flushed for the model
// now (what the evaluation counts as a task's context). `emitted` holds the
// tokens `chat` has made final so far.
size_t TokensBefore(const ChatTokenizer& chat, const std::vector<TaggedToken>& emitted) {
  ChatTokenizer copy = chat;
  std::vector<TaggedToken> held;
  copy.Flush(&held);
  return emitted.size() + held.size();
}

// --model is a fetch-model.sh name or a path; --threads sizes the products.
absl::StatusOr<std::unique_ptr<LoadedModel>> LoadFlagsModel(const Flags& f) {
  auto path = ModelPath(f.model);
  if (!path.ok()) return path.status();
  if (*path != f.model && ::access(path->c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("model ", f.model, " is not fetched (", *path,
                                            "): run scripts/fetch-model.sh ", f.model));
  }
  ModelLoadOptions o;
  o.threads = f.threads;
  return LoadModel(*path, o);
}

int RunScript(const Flags& f) {
  std::ifstream in(f.script);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat(f.script, ": cannot open the script")));
  auto m = LoadFlagsModel(f);
  if (!m.ok()) return Fail(m.status());
  // --count-tokens renders and tokenizes the messages only: no store, no model run.
  absl::StatusOr<std::unique_ptr<KvStore>> store = std::unique_ptr<KvStore>();
  if (!f.count_tokens) store = MakeStore(f, **m);
  if (!store.ok()) return Fail(store.status());
  // --teacher-force: one reference turn per generated turn, in order.
  std::vector<ReferenceTurn> forced_turns;
  if (!f.teacher_force.empty()) {
    std::ifstream tf(f.teacher_force);
    if (!tf) return Fail(absl::NotFoundError(absl::StrCat(f.teacher_force, ": cannot open")));
    std::string tline;
    for (int n = 1; std::getline(tf, tline); ++n) {
      if (tline.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto t = ParseReferenceTurn(tline);
      if (!t.ok()) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat(f.teacher_force, ":", n, ": ", t.status().message())));
      }
      forced_turns.push_back(std::move(*t));
    }
  }
  std::unique_ptr<std::ofstream> logprobs_out;
  if (!f.logprobs_out.empty()) {
    logprobs_out = std::make_unique<std::ofstream>(f.logprobs_out, std::ios::trunc);
    if (!*logprobs_out) {
      return Fail(absl::NotFoundError(absl::StrCat(f.logprobs_out, ": cannot write")));
    }
  }
  Conversation conv(m->get(), store->get(), ConversationOptionsOf(f));
  ChatTokenizer chat(&(*m)->chat_template, (*m)->tokenizer.get());
  std::vector<TaggedToken> emitted;
  int count_turn = 0;
  const auto count_line = [&](int line_no, const std::string& id, const std::string& role,
                              bool generate) {
    JsonValue o = {{"line", line_no},
                   {"id", id},
                   {"role", role},
                   {"position", TokensBefore(chat, emitted)}};
    if (generate) o["generate"] = true;
    std::printf("%s\n", DumpJson(o).c_str());
  };
  if (f.count_tokens) {
    // First the model's KV geometry, which sizes each token's cache.
    const ModelConfig& mc = (*m)->model->config();
    std::printf("%s\n", DumpJson({{"model", mc.name},
                                  {"num_layers", mc.num_layers},
                                  {"num_kv_heads", mc.num_kv_heads},
                                  {"head_dim", mc.head_dim},
                                  {"context_length", mc.context_length}})
                             .c_str());
  }

  std::string line;
  int line_no = 0, generated = 0;
  int64_t total_prompt = 0, total_completion = 0, total_steps = 0;
  double total_prefill = 0, total_decode = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto where = [&](const auto& what) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.script, ":", line_no, ": ", std::string(what)));
    };
    auto v = ParseJson(line);
    if (!v.ok()) return Fail(where(v.status().message()));
    if (!v->is_object()) return Fail(where("expected a JSON object"));
    const auto& o = *v;
    auto get_str = [&](const char* key, std::string* out) -> absl::Status {
      auto it = o.find(key);
      if (it == o.end()) return absl::NotFoundError(key);
      if (!it->is_string()) return where(absl::StrCat("\"", key, "\" must be a string"));
      *out = it->get_ref<const std::string&>();
      return absl::OkStatus();
    };
    if (auto t = o.find("tools"); t != o.end()) {
      // {"tools": [schema, ...]}: declared once, before the first message.
      if (o.count("role") != 0) return Fail(where("a \"tools\" line is a line of its own"));
      if (!t->is_array()) return Fail(where("\"tools\" must be an array of JSON Schemas"));
      auto tools = t->get<std::vector<JsonValue>>();
      if (auto s = f.count_tokens ? chat.SetTools(std::move(tools)) : conv.SetTools(std::move(tools));
          !s.ok()) {
        return Fail(where(s.message()));
      }
      continue;
    }
    std::string role_s, content, intent, id = absl::StrCat(line_no);
    if (auto s = get_str("role", &role_s); !s.ok()) {
      return Fail(absl::IsNotFound(s) ? where("missing \"role\"") : s);
    }
    auto role = ParseRole(role_s);
    if (!role.ok()) return Fail(where(role.status().message()));
    if (auto s = get_str("intent", &intent); !s.ok() && !absl::IsNotFound(s)) return Fail(s);
    if (auto s = get_str("id", &id); !s.ok() && !absl::IsNotFound(s)) {
      auto it = o.find("id");  // Numbers are fine as ids too.
      if (!it->is_number()) return Fail(s);
      id = absl::StrCat(it->get<double>());
    }
    const absl::Status cs = get_str("content", &content);
    if (!cs.ok() && !absl::IsNotFound(cs)) return Fail(cs);
    if (cs.ok() || o.count("tool_calls") != 0) {  // History: a message, or calls made.
      auto message = ChatMessageFromJson(*v);
      if (!message.ok()) return Fail(where(message.status().message()));
      if (f.count_tokens) {
        count_line(line_no, id, role_s, false);
        chat.AddMessage(*message, count_turn++, &emitted);
        continue;
      }
      if (message->role == Role::kToolOutput && f.pause_before_tools_ms > 0) {
        // The agent waits for its tool: what it holds is computed, its
        // session idle meanwhile (polykvd may offload it).
        std::vector<float> logits;
        if (auto s = conv.Flush(&logits); !s.ok()) return Fail(where(s.message()));
        if (auto s = (*store)->Idle(); !s.ok()) return Fail(where(s.message()));
        std::this_thread::sleep_for(std::chrono::milliseconds(f.pause_before_tools_ms));
      }
      if (auto s = conv.AddMessage(*message, intent); !s.ok()) return Fail(where(s.message()));
      continue;
    }
    if (*role != Role::kAssistant) return Fail(where("only an assistant line may omit \"content\""));
    // A generated turn; an assistant line with "tool_calls" was history above.
    int max_new = f.max_new_tokens;
    if (auto it = o.find("max_new_tokens"); it != o.end()) {
      if (!it->is_number() || it->get<double>() < 1) {
        return Fail(where("\"max_new_tokens\" must be a positive number"));
      }
      max_new = static_cast<int>(it->get<double>());
    }
    std::string answer_prefix;
    if (auto s = get_str("answer_prefix", &answer_prefix); !s.ok() && !absl::IsNotFound(s)) {
      return Fail(s);
    }
    if (f.count_tokens) {
      // What follows depends on the generated tokens, which only a run knows.
      count_line(line_no, id, role_s, true);
      return 0;
    }
    const int turn = conv.turns();
    ReferenceTurn record{id, {}, {}};
    ForcedSummary forced;
    const ReferenceTurn* ref = nullptr;
    if (!f.teacher_force.empty()) {
      if (static_cast<size_t>(generated) >= forced_turns.size()) {
        return Fail(where(absl::StrCat("generated turn ", generated + 1, " has no reference in ",
                                       f.teacher_force, " (", forced_turns.size(), " turns)")));
      }
      ref = &forced_turns[generated];
    }
    const StepLogitsFn on_logits = [&](int step, std::span<const float> logits) {
      if (logprobs_out) record.top.push_back(TopK(logits, f.logprobs_top));
      if (ref != nullptr) forced.Add(ScoreStep(ref->top[step], ref->targets[step], logits));
    };
    auto r = ref != nullptr ? conv.ForceTurn(ref->targets, intent, answer_prefix, on_logits)
                            : conv.Generate(max_new, intent, {}, answer_prefix, on_logits);
    if (!r.ok()) return Fail(where(r.status().message()));
    if (logprobs_out) {
      record.targets = r->tokens;
      if (r->stop == "eos") record.targets.push_back(r->stop_token);
      *logprobs_out << ReferenceTurnJson(record) << "\n";
      logprobs_out->flush();
      if (!*logprobs_out) {
        return Fail(absl::DataLossError(absl::StrCat(f.logprobs_out, ": write failed")));
      }
    }
    std::printf("%s\n", TurnJson(f, id, turn, *r, answer_prefix, **store,
                                  ref != nullptr ? &forced : nullptr).c_str());
    std::fflush(stdout);
    ++generated;
    total_prompt += r->prompt_tokens;
    total_completion += r->completion_tokens;
    total_steps += r->decode_steps;
    total_prefill += r->prefill_seconds;
    total_decode += r->decode_seconds;
  }
  if (f.count_tokens) return 0;
  const double pre_tps = total_prefill > 0 ? total_prompt / total_prefill : 0;
  const double dec_tps = total_decode > 0 ? total_steps / total_decode : 0;
  std::fprintf(stderr,
               "polykv-worker: agent %s: %d turns, %lld prompt + %lld generated tokens, "
               "prefill %.1f tok/s, decode %.1f tok/s, cache %s %lld bytes\n",
               f.agent.c_str(), generated, static_cast<long long>(total_prompt),
               static_cast<long long>(total_completion), pre_tps, dec_tps,
               (*store)->name().c_str(), static_cast<long long>((*store)->bytes()));
  if (f.summary) {
    const auto round2 = [](double x) { return std::round(x * 100) / 100; };
    std::printf("%s\n", DumpJson({{"agent", f.agent},
                                  {"summary", true},
                                  {"turns", generated},
                                  {"prompt_tokens", total_prompt},
                                  {"completion_tokens", total_completion},
                                  {"prefill_tokens_per_s", round2(pre_tps)},
                                  {"decode_tokens_per_s", round2(dec_tps)},
                                  {"cached_tokens", (*store)->num_slots()},
                                  {"cache", (*store)->name()},
                                  {"kv_bytes", (*store)->bytes()},
                                  {"kv_bytes_peak", (*store)->peak_bytes()},
                                  {"epoch", (*store)->epoch()}})
                             .c_str());
  }
  return 0;
}

int Chat(const Flags& f) {
  auto m = LoadFlagsModel(f);
  if (!m.ok()) return Fail(m.status());
  auto store = MakeStore(f, **m);
  if (!store.ok()) return Fail(store.status());
  Conversation conv(m->get(), store->get(), ConversationOptionsOf(f));
  std::fprintf(stderr, "polykv-worker chat: %s, cache %s. One message per line; Ctrl-D ends.\n",
               (*m)->model->config().name.c_str(), (*store)->name().c_str());
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (auto s = conv.AddMessage(Role::kUser, line); !s.ok()) return Fail(s);
    auto r = conv.Generate(f.max_new_tokens, "", [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    });
    if (!r.ok()) return Fail(r.status());
    std::printf("\n");
    std::fprintf(stderr, "[%d prompt + %d generated tokens, %.1f tok/s, %lld cached]\n",
                 r->prompt_tokens, r->completion_tokens,
                 r->decode_seconds > 0 ? r->decode_steps / r->decode_seconds : 0.0,
                 static_cast<long long>(r->cached_tokens));
  }
  return 0;
}

}  // namespace
}  // namespace polykv::worker

int main(int argc, char** argv) {
  polykv::worker::UseFastBlasKernels(argv);
  using polykv::worker::Flags;
  Flags f;
  f.model = polykv::worker::DefaultModelPath();
  CLI::App app{"polykv-worker: reference LLM worker whose KV cache lives in polykvd's pool"};
  app.require_subcommand(1);
  auto add_common = [&f](CLI::App* c) {
    c->add_option("--model", f.model, "model: a scripts/fetch-model.sh name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b) or a GGUF path (default: $POLYKV_MODEL_PATH or smollm2-135m)");
    c->add_option("--daemon", f.daemon, "polykvd socket: keep the KV cache in the daemon's pool");
    c->add_flag("--local-cache", f.local_cache, "keep the KV cache in process memory (dense f32; the baseline)");
    c->add_flag("--local-pages", f.local_pages, "keep the KV cache in process-memory pages (paged store without a daemon)");
    c->add_option("--tenant", f.tenant, "tenant of the daemon session");
    c->add_option("--key-format", f.key_format,
                  "page format of keys: " + polykv::kernels::FormatShortNames());
    c->add_option("--value-format", f.value_format, "page format of values");
    c->add_option("--block-tokens", f.block_tokens, "tokens per page (--local-pages; --daemon: 0 = daemon default)")
        ->check(CLI::NonNegativeNumber);
    c->add_option("--recent-f16-tokens", f.recent_f16_tokens, "paged stores: attend the newest N tokens (whole pages, plus the page being filled) from f16 copies kept beside the quantized pages (KIVI's residual); counted in kv_bytes. 0 = none")
        ->check(CLI::NonNegativeNumber);
    c->add_flag("--pages-on-device", f.pages_on_device,
                "--daemon: the KV pages in the daemon's GPU memory (polykvd --tier cuda); "
                "attention and page encodes run as CUDA kernels, the model's matmuls stay on "
                "the CPU");
    c->add_option("--attention", f.attention, "--local-cache attention: kernels (default) or blas");
    c->add_option("--agent", f.agent, "agent id reported to the daemon and in the output");
    c->add_option("--max-new-tokens", f.max_new_tokens, "default cap on generated tokens per turn")
        ->check(CLI::PositiveNumber);
    c->add_option("--seed", f.seed, "sampler seed");
    c->add_option("--temperature", f.temperature, "0 = greedy (default)")->check(CLI::NonNegativeNumber);
    c->add_option("--top-p", f.top_p, "nucleus sampling mass (with --temperature > 0)")->check(CLI::Range(0.0, 1.0));
    c->add_option("--prefill-chunk", f.prefill_chunk, "tokens per prefill step")->check(CLI::PositiveNumber);
    c->add_option("--reserve-retry-ms", f.reserve_retry_ms, "--daemon: how long to go on retrying (Sync, then retry every 200 ms) when the pool refuses a reservation under memory pressure; 0 = fail at once")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    c->add_flag("--no-intent-probe", f.no_intent_probe, "--daemon: do not probe each message's \"intent\" over the cache (the daemon's intent policies then rank by attention)");
    c->add_flag("--no-reconstruct", f.no_reconstruct, "--daemon: do not run the context-reconstruction probes the agent's policy asks for (kvzip; they about double prefill); its slots then all rank alike");
    c->add_option("--observation-window", f.observation_window, "--daemon: tokens at the end of each user or tool message that probe the cache again when the agent's policy ranks by SnapKV's observation window (snapkv); 0 = none, its slots then rank by decayed attention")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    c->add_option("--share-prefix-messages", f.share_prefix_messages, "--daemon: share the whole pages of the conversation's first N messages (1: the system prompt) with later sessions of the tenant and model, and attach what another session shared of them instead of computing it (docs/prefix-sharing.md); 0 = neither")
        ->check(CLI::NonNegativeNumber);
    c->add_option("--threads", f.threads, "threads of the weight products and attention kernels (0 = all cores); use 1 per worker when several share a host")->check(CLI::NonNegativeNumber);
    c->add_option("--max-context", f.max_context, "KV slots of the local cache")->check(CLI::PositiveNumber);
  };
  CLI::App* run = app.add_subcommand("run", "run a JSONL conversation script");
  run->add_option("script", f.script, "SCRIPT.jsonl")->required();
  run->add_flag("--summary", f.summary, "print a final summary JSON line");
  run->add_option("--pause-before-tools-ms", f.pause_before_tools_ms,
                  "before each tool message, wait this long as an agent waits for its tool: "
                  "the context so far is prefilled and the session idle meanwhile (polykvd may "
                  "offload it); 0 = none")
      ->check(CLI::NonNegativeNumber);
  run->add_flag("--count-tokens", f.count_tokens,
                "run no model: print the model's KV geometry, then each message's position (the "
                "tokens before it); stops at the first generated turn");
  run->add_option("--logprobs-out", f.logprobs_out,
                  "write each generated turn's tokens and the top-k log-probabilities before each "
                  "(JSONL, one line per turn): the reference for --teacher-force");
  run->add_option("--logprobs-top", f.logprobs_top, "k of --logprobs-out")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  run->add_option("--teacher-force", f.teacher_force,
                  "a --logprobs-out file: each generated turn is that turn's tokens instead of "
                  "sampled ones, and its output says how far this cache's predictions are from "
                  "the reference's (kl_mean, top1_agreement)");
  add_common(run);
  CLI::App* chat = app.add_subcommand("chat", "interactive chat on stdin/stdout");
  add_common(chat);
  CLI11_PARSE(app, argc, argv);
  if (run->parsed()) return polykv::worker::RunScript(f);
  return polykv::worker::Chat(f);
}
