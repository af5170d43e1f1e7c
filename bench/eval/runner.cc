#include "bench/eval/runner.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/eval/compress.h"
#include "client/worker/clock.h"
#include "bench/eval/eval_kv_store.h"
#include "client/worker/json.h"

namespace polykv::eval {
namespace {

// Six significant digits, as the records have always carried.
double Num(double v) { return std::strtod(absl::StrFormat("%.6g", v).c_str(), nullptr); }

// The most recent f32 window queries SnapKV observes (its paper's default).
constexpr int kObservationWindow = 32;

struct Outcome {
  absl::Status status;
  std::vector<int32_t> tokens;
  std::string text, stop;
  int question_tokens = 0;
  int64_t bytes_context = 0, bytes_peak = 0;
  double kept_slots_mean = 0, compaction_ms = 0, decode_tps = 0;
  int64_t merged_groups = 0, requant_blocks = 0;
  // Teacher-forced on the reference's answer; `forced_status` its own error.
  absl::Status forced_status = absl::FailedPreconditionError("not forced");
  worker::ForcedSummary forced;
};

struct Agreement {
  double prefix = 0, token = 0;
};

Agreement Compare(const std::vector<int32_t>& ref, const std::vector<int32_t>& out) {
  if (ref.empty() && out.empty()) return {1, 1};
  size_t prefix = 0;
  while (prefix < ref.size() && prefix < out.size() && ref[prefix] == out[prefix]) ++prefix;
  size_t same = 0;
  for (size_t i = 0; i < std::min(ref.size(), out.size()); ++i) same += ref[i] == out[i];
  // Extra tokens past the reference count as disagreement too.
  const double denom = static_cast<double>(std::max(ref.size(), out.size()));
  return {ref.empty() ? 0.0 : static_cast<double>(prefix) / static_cast<double>(ref.size()),
          static_cast<double>(same) / denom};
}

}  // namespace

absl::StatusOr<std::vector<std::string>> RunTask(
    const worker::LoadedModel& model, const Task& task, const std::vector<CacheConfig>& configs_in,
    const RunnerOptions& options, const std::function<void(const TaskProgress&)>& progress) {
  const worker::ModelConfig& mc = model.model->config();
  const int threads = std::max(1, options.threads);

  std::vector<CacheConfig> configs;
  auto ref = ParseCacheConfig(kReferenceConfig);
  if (!ref.ok()) return ref.status();
  configs.push_back(*ref);
  for (const CacheConfig& c : configs_in) {
    if (c.text != ref->text) configs.push_back(c);
  }
  std::map<std::string, std::unique_ptr<policies::Policy>> policy_by_name;
  for (const CacheConfig& c : configs) {
    if (c.full() || policy_by_name.count(c.policy)) continue;
    auto p = policies::MakePolicyFromText(c.policy);
    if (!p.ok()) return p.status();
    // The harness's prefill runs no reconstruction probes: such a policy
    // would rank every slot alike here, a number that means nothing.
    if ((*p)->Reads().has(policies::ScoreStream::kImportance)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config ", c.text, ": policy ", c.policy,
          " ranks by reconstruction importance, which only the product path measures (--live)"));
    }
    policy_by_name[c.policy] = std::move(*p);
  }

  // 1. The shared prefill: full f32 cache, scores captured.
  openblas_set_num_threads(threads);
  EvalKvStoreOptions base_options;
  base_options.shape = mc.kv_shape();
  base_options.append_format = kernels::PageFormat::kF32;
  base_options.capture_scores = true;
  base_options.obs_window = kObservationWindow;
  auto base_or = EvalKvStore::Create(base_options);
  if (!base_or.ok()) return base_or.status();
  EvalKvStore& base = **base_or;
  worker::ConversationOptions copts;
  copts.prefill_chunk = options.prefill_chunk;
  worker::Conversation conv(&model, &base, copts);
  if (progress) progress({"prefill", 0, 1});
  const double t0 = worker::SteadySeconds();
  for (const TaskMessage& m : task.context) {
    absl::Status s = m.generate ? conv.Generate(m.max_new_tokens, m.intent).status()
                                : conv.AddMessage(m.role, m.content, m.intent);
    if (!s.ok()) return s;
  }
  std::vector<float> logits;
  if (absl::Status s = conv.Flush(&logits); !s.ok()) return s;
  const double prefill_s = worker::SteadySeconds() - t0;
  const int64_t context_tokens = base.num_slots();
  if (context_tokens + 64 > mc.context_length) {
    return absl::InvalidArgumentError(absl::StrCat(task.file, ": context of ", context_tokens,
                                                   " tokens leaves no room in the model's ",
                                                   mc.context_length));
  }

  // 2. The intent probe: the next turn's plan step as queries over the
  // context (IntentKV relevance), not cached.
  if (!task.generation.intent.empty()) {
    const std::vector<int32_t> ids = model.tokenizer->Encode(task.generation.intent, false);
    std::vector<worker::StepToken> probe;
    for (size_t i = 0; i < ids.size(); ++i) {
      probe.push_back({ids[i], static_cast<int32_t>(conv.next_position() + i), conv.turns(),
                       worker::Role::kAssistant});
    }
    base.set_probe(true);
    if (!probe.empty()) {
      if (absl::Status s = model.model->Forward(probe, &base, &logits); !s.ok()) return s;
    }
    base.set_probe(false);
  }

  // 3. The view every policy decides on.
  std::vector<std::string> texts;
  texts.reserve(base.tokens().size());
  for (const worker::StepToken& t : base.tokens()) {
    const int32_t id = t.token_id;
    texts.push_back(model.tokenizer->TokenText(id));
  }
  const int32_t answer_turn = conv.turns() + (task.has_question ? 1 : 0);
  // One view per page size among the configurations (plans address blocks).
  std::map<int, policies::SessionView> views;
  for (const CacheConfig& c : configs) {
    if (c.full() || views.count(c.block_tokens)) continue;
    auto view = BuildContextView(base, texts, answer_turn, c.block_tokens);
    if (!view.ok()) return view.status();
    views.emplace(c.block_tokens, std::move(*view));
  }

  // 4. Every configuration from the one prefill.
  struct Compressed {
    std::unique_ptr<EvalKvStore> store;
    Selection sel;
  };
  const auto compress = [&](const CacheConfig& c) -> absl::StatusOr<Compressed> {
    Compressed out;
    if (c.full()) {
      out.sel.layers = KeepAll(base);
      out.sel.kept_slots_mean = static_cast<double>(context_tokens);
    } else {
      auto s = Select(*policy_by_name.at(c.policy), views.at(c.block_tokens), c.budget);
      if (!s.ok()) return s.status();
      out.sel = std::move(*s);
    }
    EvalKvStoreOptions so;
    so.shape = mc.kv_shape();
    so.append_format = c.append_format;
    so.block_tokens = c.block_tokens;
    auto store = EvalKvStore::Compact(base, out.sel.layers, c.k_format, c.v_format, c.f16_tail, so);
    if (!store.ok()) return store.status();
    out.store = std::move(*store);
    return out;
  };
  // The reference's answer (its stop too) with its top-k before each token,
  // as decoded and as forced; the configurations are scored against the
  // forced one (client/worker/logprobs.h says why).
  worker::ReferenceTurn decoded_turn, reference_turn;
  // A configuration's compressed cache and the conversation that answers on
  // it, its question queued.
  struct Prepared {
    absl::StatusOr<Compressed> compressed = absl::UnknownError("not compressed");
    std::optional<worker::Conversation> fork;
  };
  const auto prepare = [&](const CacheConfig& c, Outcome* o) {
    Prepared p;
    const double tc = worker::SteadySeconds();
    p.compressed = compress(c);
    if (!p.compressed.ok()) {
      o->status = p.compressed.status();
      return p;
    }
    o->compaction_ms = (worker::SteadySeconds() - tc) * 1e3;
    o->kept_slots_mean = p.compressed->sel.kept_slots_mean;
    o->merged_groups = p.compressed->sel.merged_groups;
    o->requant_blocks = p.compressed->sel.requant_blocks;
    o->bytes_context = p.compressed->store->bytes();
    p.fork.emplace(conv.Fork(p.compressed->store.get()));
    if (task.has_question) {
      o->status =
          p.fork->AddMessage(task.question.role, task.question.content, task.question.intent);
    }
    return p;
  };
  const auto finish = [&](const absl::StatusOr<worker::TurnResult>& r, const Prepared& p,
                          Outcome* o) {
    if (!r.ok()) {
      o->status = r.status();
      return;
    }
    o->tokens = r->tokens;
    // The answer as the turn reads (what the scorer checks).
    o->text = task.generation.answer_prefix + r->text;
    o->stop = r->stop;
    o->question_tokens = r->prompt_tokens;
    o->bytes_peak = p.compressed->store->bytes();
    o->decode_tps = r->decode_seconds > 0 ? r->decode_steps / r->decode_seconds : 0;
  };
  // Answers one configuration on its own; `record`: it is the reference.
  const auto run = [&](const CacheConfig& c, bool record) {
    Outcome o;
    Prepared p = prepare(c, &o);
    if (!o.status.ok()) return o;
    const worker::StepLogitsFn on_logits = [&](int, std::span<const float> logits) {
      decoded_turn.top.push_back(worker::TopK(logits, options.logprobs_top));
    };
    auto r = p.fork->Generate(task.generation.max_new_tokens, task.generation.intent, {},
                              task.generation.answer_prefix,
                              record ? on_logits : worker::StepLogitsFn{});
    finish(r, p, &o);
    if (record && r.ok()) {
      decoded_turn.targets = r->tokens;
      if (r->stop == "eos") decoded_turn.targets.push_back(r->stop_token);
    }
    return o;
  };
  // The same compression again, answering with the reference's tokens,
  // scored against `ref`; `record`: its top-k become the reference's.
  const auto force = [&](const CacheConfig& c, const worker::ReferenceTurn& ref, Outcome* o,
                         worker::ReferenceTurn* record) {
    auto compressed = compress(c);
    if (!compressed.ok()) {
      o->forced_status = compressed.status();
      return;
    }
    worker::Conversation fork = conv.Fork(compressed->store.get());
    if (task.has_question) {
      o->forced_status =
          fork.AddMessage(task.question.role, task.question.content, task.question.intent);
      if (!o->forced_status.ok()) return;
    }
    auto r = fork.ForceTurn(ref.targets, task.generation.intent, task.generation.answer_prefix,
                            [&](int step, std::span<const float> logits) {
                              o->forced.Add(
                                  worker::ScoreStep(ref.top[step], ref.targets[step], logits));
                              if (record != nullptr) {
                                record->top.push_back(worker::TopK(logits, options.logprobs_top));
                              }
                            });
    o->forced_status = r.status();
    if (record != nullptr) record->targets = ref.targets;
  };

  std::vector<Outcome> outcomes(configs.size());
  outcomes[0] = run(configs[0], /*record=*/options.teacher_force);
  if (!outcomes[0].status.ok()) return outcomes[0].status;
  // The reference forced on its own answer: its KL (against its decode) is
  // the rounding of a chunk against one token per step.
  if (options.teacher_force) {
    force(configs[0], decoded_turn, &outcomes[0], &reference_turn);
    if (!outcomes[0].forced_status.ok()) return outcomes[0].forced_status;
  }
  if (progress) progress({"config", 1, static_cast<int>(configs.size())});
  // Each configuration on one thread; BLAS single-threaded under them.
  openblas_set_num_threads(1);
  std::mutex mu;
  std::atomic<int> done{1};
  const auto report = [&] {
    const int d = ++done;
    if (progress) {
      std::lock_guard<std::mutex> lock(mu);
      progress({"config", d, static_cast<int>(configs.size())});
    }
  };
  // Runs fn(i) for every configuration i >= 1 on `threads` threads.
  const auto for_configs = [&](const std::function<void(size_t)>& fn) {
    std::atomic<size_t> next{1};
    const auto loop = [&] {
      for (size_t i = next++; i < configs.size(); i = next++) fn(i);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(loop);
    loop();
    for (auto& t : pool) t.join();
  };
  const auto force_config = [&](size_t i) {
    if (options.teacher_force && outcomes[i].status.ok()) {
      force(configs[i], reference_turn, &outcomes[i], nullptr);
    }
  };
  if (options.batch_decode) {
    // Caches and questions on threads; then every answer decoded together,
    // one ForwardBatch per step (the model's products use the threads).
    // (Held by pointer: a Conversation is not assignable.)
    std::vector<std::unique_ptr<Prepared>> prepared(configs.size());
    for_configs([&](size_t i) {
      prepared[i] = std::make_unique<Prepared>(prepare(configs[i], &outcomes[i]));
    });
    std::vector<worker::Conversation*> convs;
    std::vector<size_t> index;
    for (size_t i = 1; i < configs.size(); ++i) {
      if (!outcomes[i].status.ok()) continue;
      convs.push_back(&*prepared[i]->fork);
      index.push_back(i);
    }
    const auto results = worker::Conversation::GenerateBatch(
        convs, task.generation.max_new_tokens, task.generation.intent,
        task.generation.answer_prefix);
    for (size_t j = 0; j < index.size(); ++j) {
      finish(results[j], *prepared[index[j]], &outcomes[index[j]]);
    }
    prepared.clear();
    for_configs([&](size_t i) {
      force_config(i);
      report();
    });
  } else {
    for_configs([&](size_t i) {
      outcomes[i] = run(configs[i], /*record=*/false);
      force_config(i);
      report();
    });
  }

  const kernels::PageShape ps{kDefaultBlockTokens, mc.num_kv_heads, mc.head_dim};
  const double bytes_per_token_f16 =
      static_cast<double>(kernels::PageBytes(kernels::PageFormat::kF16, kernels::KvKind::kKey, ps) +
                          kernels::PageBytes(kernels::PageFormat::kF16, kernels::KvKind::kValue, ps)) *
      mc.num_layers / kDefaultBlockTokens;
  const Outcome& reference = outcomes[0];
  std::vector<std::string> records;
  for (size_t i = 0; i < configs.size(); ++i) {
    const CacheConfig& c = configs[i];
    const Outcome& o = outcomes[i];
    worker::JsonValue rec = {
        {"task", task.id},
        {"family", task.family},
        {"file", task.file},
        {"config", c.text},
        {"policy", c.policy},
        {"budget", Num(c.budget)},
        {"formats", c.formats},
        {"k_format", std::string(kernels::FormatShortName(c.k_format))},
        {"v_format", std::string(kernels::FormatShortName(c.v_format))},
        {"block_tokens", c.block_tokens},
        {"recent_f16_tokens", c.f16_tail},
        {"context_tokens", context_tokens},
        {"prefill_tokens_per_s", Num(context_tokens / std::max(prefill_s, 1e-9))},
        {"bytes_per_token_f16", Num(bytes_per_token_f16)},
        {"bytes_full_f16", reference.bytes_peak},
        {"eval", worker::JsonValue::parse(task.eval_json)}};
    if (!o.status.ok()) {
      rec["error"] = o.status.ToString();
      records.push_back(worker::DumpJson(rec));
      continue;
    }
    const Agreement a = Compare(reference.tokens, o.tokens);
    rec.update({{"question_tokens", o.question_tokens},
                {"kept_slots_mean", Num(o.kept_slots_mean)},
                {"merged_groups", o.merged_groups},
                {"requant_blocks", o.requant_blocks},
                {"bytes_context", o.bytes_context},
                {"bytes_peak", o.bytes_peak},
                {"bytes_mean", Num((o.bytes_context + o.bytes_peak) / 2.0)},
                {"bytes_fraction",
                 Num(static_cast<double>(o.bytes_peak) / std::max<int64_t>(1, reference.bytes_peak))},
                {"answer_prefix", task.generation.answer_prefix},
                {"output", o.text},
                {"output_tokens", o.tokens},
                {"stop", o.stop},
                {"ref_tokens_len", reference.tokens.size()},
                {"prefix_agreement", Num(a.prefix)},
                {"token_agreement", Num(a.token)},
                {"decode_tokens_per_s", Num(o.decode_tps)},
                {"compaction_ms", Num(o.compaction_ms)}});
    if (o.forced_status.ok()) {
      rec.update({{"forced_positions", o.forced.positions},
                  {"kl_mean", Num(o.forced.kl_mean())},
                  {"kl_max", Num(o.forced.kl_max)},
                  {"top1_agreement", Num(o.forced.top1_agreement())},
                  {"target_logprob_mean", Num(o.forced.target_logprob_mean())}});
    } else if (options.teacher_force) {
      rec["forced_error"] = o.forced_status.ToString();
    }
    records.push_back(worker::DumpJson(rec));
  }
  return records;
}

}  // namespace polykv::eval
