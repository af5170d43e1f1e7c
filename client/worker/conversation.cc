#include "client/worker/conversation.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/worker/clock.h"

namespace polykv::worker {
namespace {

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence.
size_t CompleteUtf8Prefix(std::string_view s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // Continuation byte.
    const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < len ? n - back : n;
  }
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& gguf_path,
                                                      const ModelLoadOptions& options) {
  auto file = GgufFile::Open(gguf_path);
  if (!file.ok()) return file.status();
  auto out = std::make_unique<LoadedModel>();
  std::shared_ptr<const GgufFile> shared(std::move(*file));
  auto model = LlamaModel::Load(shared, options);
  if (!model.ok()) return model.status();
  out->model = std::move(*model);
  auto tok = Tokenizer::FromGguf(*shared);
  if (!tok.ok()) return tok.status();
  out->tokenizer = std::move(*tok);
  auto tmpl = ChatTemplate::FromGguf(*shared);
  if (!tmpl.ok()) return tmpl.status();
  out->chat_template = *tmpl;
  if (out->tokenizer->vocab_size() != out->model->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        gguf_path, ": tokenizer has ", out->tokenizer->vocab_size(), " tokens, model ",
        out->model->config().vocab_size));
  }
  if (out->tokenizer->TokenId(out->chat_template.end_of_turn()) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(gguf_path, ": vocabulary has no ", out->chat_template.end_of_turn()));
  }
  return out;
}

namespace {
std::string ModelDir() {
  if (const char* d = std::getenv("POLYKV_MODEL_DIR"); d != nullptr && *d != '\0') return d;
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : "", "/.cache/polykv/models");
}

// The file names scripts/fetch-model.sh writes; keep the two in step.
// const char*, not std::string_view: this absl's string_view is its own type,
// so StrCat does not take std::string_view.
struct ModelFile {
  const char* name;
  const char* file;
};
constexpr ModelFile kModelFiles[] = {
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.gguf"},
    {"qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct.gguf"},
};
}  // namespace

std::string DefaultModelPath() {
  if (const char* p = std::getenv("POLYKV_MODEL_PATH"); p != nullptr && *p != '\0') return p;
  return absl::StrCat(ModelDir(), "/", kModelFiles[0].file);
}

absl::StatusOr<std::string> ModelPath(std::string_view name_view) {
  const std::string name(name_view);
  if (name.find('/') != std::string::npos || absl::EndsWith(name, ".gguf")) return name;
  std::string known;
  for (const ModelFile& m : kModelFiles) {
    if (m.name == name) return absl::StrCat(ModelDir(), "/", m.file);
    absl::StrAppend(&known, known.empty() ? "" : ", ", m.name);
  }
  return absl::NotFoundError(absl::StrCat("unknown model \"", name, "\" (known: ", known,
                                          "; or a path to a .gguf file)"));
}

absl::StatusOr<Role> ParseRole(std::string_view role) {
  if (role == "system") return Role::kSystem;
  if (role == "user") return Role::kUser;
  if (role == "assistant") return Role::kAssistant;
  if (role == "tool") return Role::kToolOutput;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role \"", std::string(role), "\" (expected system, user, tool or assistant)"));
}

Conversation::Conversation(const LoadedModel* model, KvStore* store,
                           const ConversationOptions& options)
    : m_(model),
      store_(store),
      options_(options),
      sampler_(options.sampler),
      chat_(&model->chat_template, model->tokenizer.get()) {
  end_of_turn_id_ = m_->tokenizer->TokenId(m_->chat_template.end_of_turn());
}

void Conversation::Queue(const std::vector<int32_t>& ids, Role role) {
  for (int32_t id : ids) {
    pending_.push_back(StepToken{id, next_position_++, turn_, role});
  }
}

void Conversation::Queue(const std::vector<TaggedToken>& tokens) {
  for (const TaggedToken& t : tokens) {
    pending_.push_back(StepToken{t.id, next_position_++, t.turn, t.role});
  }
}

absl::Status Conversation::AddMessage(const ChatMessage& message, std::string_view intent) {
  if (absl::Status s = store_->BeginTurn(TurnInfo{turn_, message.role, std::string(intent)});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ProbeObservation(); !s.ok()) return s;
  if (absl::Status s = ProbeIntent(intent); !s.ok()) return s;
  std::vector<TaggedToken> tokens;
  chat_.AddMessage(message, turn_, &tokens);
  Queue(tokens);
  observe_next_ = message.role == Role::kUser || message.role == Role::kToolOutput ||
                  message.role == Role::kError;
  ++turn_;
  return absl::OkStatus();
}

absl::Status Conversation::Flush(std::vector<float>* last_logits) {
  std::vector<TaggedToken> held;
  chat_.Flush(&held);
  Queue(held);
  return ForwardPending(last_logits);
}

absl::Status Conversation::AttachSharedPrefix() {
  prefix_tried_ = true;
  if (store_->num_slots() != 0 || pending_.size() < 2) return absl::OkStatus();
  // The last token is run either way: its logits are what the caller wants.
  const double t0 = SteadySeconds();
  auto attached = store_->AttachPrefix(std::span(pending_).first(pending_.size() - 1));
  if (!attached.ok()) return attached.status();
  attach_seconds_ += SteadySeconds() - t0;
  pending_.erase(pending_.begin(), pending_.begin() + *attached);
  attached_tokens_ += *attached;
  return absl::OkStatus();
}

absl::Status Conversation::ForwardPending(std::vector<float>* last_logits) {
  const double t0 = SteadySeconds();
  if (options_.share_prefix && !prefix_tried_) {
    if (absl::Status s = AttachSharedPrefix(); !s.ok()) return s;
  }
  prefilled_tokens_ += static_cast<int64_t>(pending_.size());
  const int chunk = std::max(1, options_.prefill_chunk);
  for (size_t i = 0; i < pending_.size(); i += chunk) {
    const size_t n = std::min(pending_.size() - i, static_cast<size_t>(chunk));
    const std::span<const StepToken> chunk = std::span(pending_).subspan(i, n);
    if (absl::Status s = m_->model->Forward(chunk, store_, last_logits); !s.ok()) return s;
    if (absl::Status s = ProbeReconstruction(chunk); !s.ok()) return s;
  }
  const size_t w = static_cast<size_t>(std::max(0, options_.observation_window));
  last_prefilled_.insert(last_prefilled_.end(),
                         pending_.end() - std::min(w, pending_.size()), pending_.end());
  if (last_prefilled_.size() > w) {
    last_prefilled_.erase(last_prefilled_.begin(), last_prefilled_.end() - w);
  }
  pending_.clear();
  prefill_seconds_ += SteadySeconds() - t0;
  return absl::OkStatus();
}

bool Conversation::IsEndOfTurn(int32_t id) const {
  return id == end_of_turn_id_ || id == m_->tokenizer->eos_id();
}

absl::Status Conversation::BeginGeneratedTurn(std::string_view intent,
                                              std::string_view answer_prefix,
                                              std::vector<float>* logits, TurnResult* r) {
  if (absl::Status s = store_->BeginTurn(TurnInfo{turn_, Role::kAssistant, std::string(intent)});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ProbeObservation(); !s.ok()) return s;
  observe_next_ = false;
  if (absl::Status s = ProbeIntent(intent); !s.ok()) return s;
  std::vector<TaggedToken> prompt;
  chat_.AddGenerationPrompt(turn_, &prompt);
  Queue(prompt);
  if (!answer_prefix.empty()) Queue(m_->tokenizer->Encode(answer_prefix, false), Role::kAssistant);
  if (absl::Status s = Flush(logits); !s.ok()) return s;
  // Everything prefilled since the last turn: messages flushed early for an
  // intent probe count here, as they would had they waited for this flush.
  r->prompt_tokens = static_cast<int>(std::exchange(prefilled_tokens_, 0));
  r->attached_tokens = std::exchange(attached_tokens_, 0);
  r->attach_seconds = std::exchange(attach_seconds_, 0.0);
  r->prefill_seconds = std::exchange(prefill_seconds_, 0.0);
  return absl::OkStatus();
}

void Conversation::EndGeneratedTurn(TurnResult* r) {
  r->text = m_->tokenizer->Decode(r->tokens, /*skip_special=*/true);
  // These tokens are prefilled with the next message.
  if (r->stop == "length" && !r->tokens.empty()) {
    pending_.push_back(StepToken{r->tokens.back(), next_position_++, turn_, Role::kAssistant});
  }
  pending_.push_back(StepToken{end_of_turn_id_, next_position_++, turn_, Role::kAssistant});
  std::vector<TaggedToken> after;
  chat_.AddAfterGeneratedTurn(turn_, &after);
  Queue(after);
  ++turn_;
  r->cached_tokens = store_->num_slots();
}

absl::StatusOr<TurnResult> Conversation::Generate(
    int max_new_tokens, std::string_view intent,
    const std::function<void(std::string_view)>& on_text, std::string_view answer_prefix,
    const StepLogitsFn& on_logits) {
  if (max_new_tokens <= 0) return absl::InvalidArgumentError("max_new_tokens must be positive");
  TurnResult r;
  std::vector<float> logits;
  if (absl::Status s = BeginGeneratedTurn(intent, answer_prefix, &logits, &r); !s.ok()) return s;

  double t0 = SteadySeconds();
  size_t printed = 0;
  r.stop = "length";
  for (int i = 0; i < max_new_tokens; ++i) {
    if (on_logits) on_logits(i, logits);
    const int32_t id = sampler_.Sample(logits);
    const bool more = Accept(id, i, max_new_tokens, &r);
    if (r.stop == "eos") break;
    if (on_text) {
      const std::string text = m_->tokenizer->Decode(r.tokens, /*skip_special=*/true);
      const size_t ready = CompleteUtf8Prefix(text);
      if (ready > printed) {
        on_text(std::string_view(text).substr(printed, ready - printed));
        printed = ready;
      }
    }
    if (!more) break;
    const StepToken meta{id, next_position_++, turn_, Role::kAssistant};
    if (absl::Status s = m_->model->Forward(std::span(&meta, 1), store_, &logits); !s.ok()) {
      return s;
    }
    ++r.decode_steps;
  }
  r.decode_seconds = SteadySeconds() - t0;
  EndGeneratedTurn(&r);
  // The agent now waits for its next message: the cache may move meanwhile.
  if (absl::Status s = store_->Idle(); !s.ok()) return s;
  if (on_text && r.text.size() > printed) on_text(std::string_view(r.text).substr(printed));
  return r;
}

bool Conversation::Accept(int32_t id, int step, int max_new_tokens, TurnResult* r) const {
  ++r->completion_tokens;
  if (IsEndOfTurn(id)) {
    r->stop = "eos";
    r->stop_token = id;
    return false;
  }
  r->tokens.push_back(id);
  return step + 1 < max_new_tokens;  // The last token is fed with the next turn.
}

std::vector<absl::StatusOr<TurnResult>> Conversation::GenerateBatch(
    std::span<Conversation* const> convs, int max_new_tokens, std::string_view intent,
    std::string_view answer_prefix) {
  const size_t n = convs.size();
  std::vector<absl::StatusOr<TurnResult>> out(n, TurnResult{});
  if (max_new_tokens <= 0) {
    out.assign(n, absl::InvalidArgumentError("max_new_tokens must be positive"));
    return out;
  }
  std::vector<std::vector<float>> logits(n);
  std::vector<bool> active(n, false);
  for (size_t i = 0; i < n; ++i) {
    Conversation* c = convs[i];
    if (c->m_ != convs[0]->m_) {
      out[i] = absl::InvalidArgumentError("GenerateBatch: conversations of different models");
      continue;
    }
    if (absl::Status s = c->BeginGeneratedTurn(intent, answer_prefix, &logits[i], &*out[i]);
        !s.ok()) {
      out[i] = s;
      continue;
    }
    out[i]->stop = "length";
    active[i] = true;
  }
  const int vocab = n > 0 ? convs[0]->m_->model->config().vocab_size : 0;
  std::vector<StepToken> metas;
  std::vector<KvStore*> stores;
  std::vector<size_t> rows;
  std::vector<float> all;
  for (int step = 0; step < max_new_tokens; ++step) {
    metas.clear();
    stores.clear();
    rows.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!active[i]) continue;
      Conversation* c = convs[i];
      const int32_t id = c->sampler_.Sample(logits[i]);
      if (!c->Accept(id, step, max_new_tokens, &*out[i])) {
        active[i] = false;
        continue;
      }
      metas.push_back(StepToken{id, c->next_position_++, c->turn_, Role::kAssistant});
      stores.push_back(c->store_);
      rows.push_back(i);
    }
    if (rows.empty()) break;
    const double t0 = SteadySeconds();
    absl::Status s = convs[0]->m_->model->ForwardBatch(metas, stores, &all);
    const double dt = SteadySeconds() - t0;
    for (size_t j = 0; j < rows.size(); ++j) {
      TurnResult& r = *out[rows[j]];
      r.decode_seconds += dt;
      if (!s.ok()) {
        out[rows[j]] = s;
        active[rows[j]] = false;
        continue;
      }
      logits[rows[j]].assign(all.begin() + static_cast<std::ptrdiff_t>(j) * vocab,
                             all.begin() + static_cast<std::ptrdiff_t>(j + 1) * vocab);
      ++r.decode_steps;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (out[i].ok()) convs[i]->EndGeneratedTurn(&*out[i]);
  }
  return out;
}

absl::StatusOr<TurnResult> Conversation::ForceTurn(const std::vector<int32_t>& targets,
                                                   std::string_view intent,
                                                   std::string_view answer_prefix,
                                                   const StepLogitsFn& on_logits) {
  if (targets.empty()) return absl::InvalidArgumentError("a forced turn needs tokens");
  const int vocab = m_->model->config().vocab_size;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < 0 || targets[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("forced token ", i, " (", targets[i], ") is not in the vocabulary"));
    }
    if (IsEndOfTurn(targets[i]) && i + 1 != targets.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("forced token ", i, " ends the turn before its last token"));
    }
  }
  TurnResult r;
  std::vector<float> logits;
  if (absl::Status s = BeginGeneratedTurn(intent, answer_prefix, &logits, &r); !s.ok()) return s;
  const double t0 = SteadySeconds();
  if (on_logits) on_logits(0, logits);
  // Every target but the last is an input, as in Generate: the last is the
  // end-of-turn token or is fed with the next turn.
  std::vector<StepToken> inputs;
  for (size_t i = 0; i + 1 < targets.size(); ++i) {
    inputs.push_back(StepToken{targets[i], next_position_++, turn_, Role::kAssistant});
  }
  const int chunk = std::max(1, options_.prefill_chunk);
  std::vector<float> rows;
  for (size_t i = 0; i < inputs.size(); i += chunk) {
    const size_t n = std::min(inputs.size() - i, static_cast<size_t>(chunk));
    if (absl::Status s =
            m_->model->Forward(std::span(inputs).subspan(i, n), store_, &logits, &rows);
        !s.ok()) {
      return s;
    }
    for (size_t j = 0; on_logits && j < n; ++j) {
      on_logits(static_cast<int>(i + j + 1),
                std::span<const float>(rows).subspan(j * vocab, vocab));
    }
  }
  r.decode_seconds = SteadySeconds() - t0;
  r.completion_tokens = static_cast<int>(targets.size());
  r.stop = IsEndOfTurn(targets.back()) ? "eos" : "length";
  if (r.stop == "eos") r.stop_token = targets.back();
  r.tokens.assign(targets.begin(), targets.end() - (r.stop == "eos" ? 1 : 0));
  EndGeneratedTurn(&r);
  return r;
}

absl::Status Conversation::ProbeReconstruction(std::span<const StepToken> chunk) {
  if (!options_.reconstruct || !store_->SupportsProbe(ProbeKind::kReconstruct)) {
    return absl::OkStatus();
  }
  // KVzip's scoring: a slot matters as much as the model attends to it when
  // asked to repeat the context. Chunk by chunk, so the probe's rows (the
  // prompt and one chunk) stay a small, transient part of the session.
  if (repeat_prompt_.empty()) {
    repeat_prompt_ = m_->tokenizer->Encode("\n\nRepeat the previous context exactly.\n", false);
  }
  std::vector<StepToken> probe;
  probe.reserve(repeat_prompt_.size() + chunk.size());
  int32_t position = chunk.back().position + 1;
  for (int32_t id : repeat_prompt_) probe.push_back(StepToken{id, position++, turn_, Role::kUser});
  for (const StepToken& t : chunk) {
    probe.push_back(StepToken{t.token_id, position++, turn_, Role::kAssistant});
  }
  std::vector<float> logits;
  if (absl::Status s = store_->BeginProbe(ProbeKind::kReconstruct); !s.ok()) return s;
  absl::Status forward = m_->model->Forward(probe, store_, &logits);
  absl::Status end = store_->EndProbe();
  return forward.ok() ? end : forward;
}

absl::Status Conversation::ProbeObservation() {
  if (!std::exchange(observe_next_, false) || options_.observation_window <= 0 ||
      !store_->SupportsProbe(ProbeKind::kObservation)) {
    return absl::OkStatus();
  }
  std::vector<float> logits;
  if (absl::Status s = ForwardPending(&logits); !s.ok()) return s;
  if (last_prefilled_.empty()) return absl::OkStatus();
  // The window's tokens at their own positions ask what they asked when they
  // were prefilled; their mass on the slots before them is SnapKV's score.
  if (absl::Status s = store_->BeginProbe(ProbeKind::kObservation); !s.ok()) return s;
  absl::Status forward = m_->model->Forward(last_prefilled_, store_, &logits);
  absl::Status end = store_->EndProbe();
  return forward.ok() ? end : forward;
}

absl::Status Conversation::ProbeIntent(std::string_view intent) {
  if (intent.empty() || !options_.intent_probe) return absl::OkStatus();
  // The probe attends over what is cached, so the final tokens queued so far
  // go in first (text the chat tokenizer still holds stays held: flushing it
  // could tokenize a boundary differently). Every store prefills so, probing
  // or not, so that where a prefill is cut into chunks (and with it the
  // floats of the forward pass) depends on the script alone: a pool session
  // that probes gives exactly what --local-cache gives.
  std::vector<float> logits;
  if (absl::Status s = ForwardPending(&logits); !s.ok()) return s;
  if (!store_->SupportsProbe(ProbeKind::kIntent) || store_->num_slots() == 0) {
    return absl::OkStatus();
  }
  const std::vector<int32_t> ids = m_->tokenizer->Encode(intent, false);
  if (ids.empty()) return absl::OkStatus();
  std::vector<StepToken> probe;
  for (size_t i = 0; i < ids.size(); ++i) {
    probe.push_back(StepToken{ids[i], next_position_ + static_cast<int32_t>(i), turn_,
                              Role::kAssistant});
  }
  if (absl::Status s = store_->BeginProbe(ProbeKind::kIntent); !s.ok()) return s;
  absl::Status forward = m_->model->Forward(probe, store_, &logits);
  absl::Status end = store_->EndProbe();
  return forward.ok() ? end : forward;
}

}  // namespace polykv::worker
