// A multi-turn conversation of one agent over one KvStore: messages are
// rendered with the chat template, tokenized and queued; Generate() prefills
// what is queued in chunks and then decodes one token per step. Only the new
// tokens of each turn go through the model: the cache keeps the rest.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/worker/chat_template.h"
#include "client/worker/chat_tokenizer.h"
#include "client/worker/kv_store.h"
#include "client/worker/model.h"
#include "client/worker/sampler.h"
#include "client/worker/tokenizer.h"

namespace polykv::worker {

// Everything loaded from one GGUF file. Immutable; shareable across threads.
struct LoadedModel {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplate chat_template;
};
absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& gguf_path,
                                                      const ModelLoadOptions& options = {});

// $POLYKV_MODEL_PATH, else ${POLYKV_MODEL_DIR:-$HOME/.cache/polykv/models}/
// SmolLM2-135M-Instruct.Q4_1.gguf (where scripts/fetch-model.sh puts it).
std::string DefaultModelPath();

// Where scripts/fetch-model.sh NAME puts the model NAME ("smollm2-135m",
// "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"), under $POLYKV_MODEL_DIR or
// $HOME/.cache/polykv/models; NotFound naming the known names otherwise. A
// NAME holding a '/' or ending in ".gguf" is taken as a path.
absl::StatusOr<std::string> ModelPath(std::string_view name);

absl::StatusOr<Role> ParseRole(std::string_view role);

struct ConversationOptions {
  int prefill_chunk = 64;     // Tokens per prefill step.
  // A message's intent is probed (KvStore::BeginProbe) over the cache when
  // the message starts, if the store supports it: the daemon's `intent`
  // policies rank the slots by it while the message is prefilled. Either way
  // the tokens queued before such a message are prefilled first.
  bool intent_probe = true;
  // After each prefill chunk, a context-reconstruction probe (KVzip) scores
  // the cache, if the store supports it (the daemon's policy asked for
  // importance at OpenSession): the "repeat the previous context" prompt and
  // the chunk's tokens again attend over the cache and report the most
  // attention each slot got. About doubles prefill; decode is untouched.
  bool reconstruct = true;
  // When the message after a user or tool message (or a generated turn)
  // starts, SnapKV's observation window, the last `observation_window` tokens
  // prefilled, runs again at its own positions as a probe over the cache, if
  // the store supports it (the daemon's policy asked for it at OpenSession):
  // what `snapkv` policies rank by. Like an intent probe, it prefills what is
  // queued first. 0: never.
  int observation_window = 32;
  // Shared prefixes (docs/prefix-sharing.md), on a store that supports them:
  // the first prefill attaches whatever leading whole blocks of the context
  // another session shared (they are not run through the model). Sharing is
  // the store's (PagedKvStoreOptions::share_prefix_messages).
  bool share_prefix = false;
  SamplerOptions sampler;
};

// Called with the next-token logits of each position of a generated turn,
// before its token is chosen (step 0: after the prompt).
using StepLogitsFn = std::function<void(int step, std::span<const float> logits)>;

struct TurnResult {
  std::string text;               // Generated text, end-of-turn token excluded.
  std::vector<int32_t> tokens;    // Generated ids, end-of-turn token excluded.
  int prompt_tokens = 0;          // Tokens prefilled for this turn.
  int64_t attached_tokens = 0;    // Tokens of the prompt attached, not prefilled (share_prefix).
  double attach_seconds = 0;      // Spent attaching them (within prefill_seconds).
  int completion_tokens = 0;      // Tokens sampled (including the end token).
  int64_t cached_tokens = 0;      // Slots in the store after the turn.
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int decode_steps = 0;           // Forward steps of one token.
  std::string stop;               // "eos" or "length".
  int32_t stop_token = -1;        // The token that ended an "eos" turn.
};

// Not thread-safe; one thread drives one conversation. The model, tokenizer
// and template must outlive it; the store is borrowed too.
class Conversation {
 public:
  Conversation(const LoadedModel* model, KvStore* store, const ConversationOptions& options);

  // The tools (JSON Schemas) the system turn declares, for templates that
  // render them (Qwen2.5). REQUIRES: no message added yet.
  absl::Status SetTools(std::vector<JsonValue> tools) { return chat_.SetTools(std::move(tools)); }

  // Queues a message (role "system", "user", "tool" or "assistant" with
  // content, or an assistant's tool calls). `intent` is reported to the
  // store with the turn.
  absl::Status AddMessage(const ChatMessage& message, std::string_view intent = "");
  absl::Status AddMessage(Role role, std::string_view content, std::string_view intent = "") {
    return AddMessage(ChatMessage{role, std::string(content), {}}, intent);
  }

  // Generates an assistant turn of at most `max_new_tokens` tokens.
  // `on_text`, when set, receives the text as it is produced (whole UTF-8).
  // `answer_prefix`, when set, is the start of the turn, written for the
  // model (prefilled, not generated; not part of the result's text).
  absl::StatusOr<TurnResult> Generate(int max_new_tokens, std::string_view intent = "",
                                      const std::function<void(std::string_view)>& on_text = {},
                                      std::string_view answer_prefix = "",
                                      const StepLogitsFn& on_logits = {});

  // Generate() for several conversations at once, each on its own store
  // (same model): their tokens go through one LlamaModel::ForwardBatch per
  // step, so the weights are read once for all of them. Each result is what
  // that conversation's own Generate() would give, token for token; its
  // decode_seconds is the batch's time while it took part.
  static std::vector<absl::StatusOr<TurnResult>> GenerateBatch(
      std::span<Conversation* const> convs, int max_new_tokens, std::string_view intent = "",
      std::string_view answer_prefix = "");

  // An assistant turn whose tokens are given (teacher forcing): the turn is
  // `targets`, which may end with the end-of-turn token (the turn then stops
  // as "eos"), run through the model in prefill chunks instead of one token
  // per step; `on_logits` sees what the model would have predicted before
  // each target. The conversation then continues as if it had generated them.
  absl::StatusOr<TurnResult> ForceTurn(const std::vector<int32_t>& targets,
                                       std::string_view intent, std::string_view answer_prefix,
                                       const StepLogitsFn& on_logits);

  // Prefills the queued tokens now; returns the last token's logits.
  absl::Status Flush(std::vector<float>* last_logits);

  // A copy of this conversation (positions, turns, queued tokens, sampler)
  // that continues on `store`, which must hold a copy of this one's cache,
  // possibly compressed: one prefilled context can answer its question
  // under many cache configurations (GenerateBatch).
  // The copy's next turn counts only what it prefills itself.
  Conversation Fork(KvStore* store) const {
    Conversation c(*this);
    c.store_ = store;
    c.prefilled_tokens_ = 0;
    c.prefill_seconds_ = 0;
    return c;
  }

  int32_t next_position() const { return next_position_; }
  int32_t turns() const { return turn_; }

 private:
  void Queue(const std::vector<int32_t>& ids, Role role);
  void Queue(const std::vector<TaggedToken>& tokens);
  // Runs the queued tokens through the model (no chat-tokenizer flush).
  absl::Status ForwardPending(std::vector<float>* last_logits);
  // share_prefix, at the first prefill: attaches what was shared of the
  // queued tokens' leading blocks and drops them from the queue.
  absl::Status AttachSharedPrefix();
  // Prefills what is queued, then runs the intent's tokens over the cache as
  // a probe the store does not keep.
  absl::Status ProbeIntent(std::string_view intent);
  // The reconstruction probe over the chunk of pending_ just prefilled.
  absl::Status ProbeReconstruction(std::span<const StepToken> chunk);
  // The observation probe, when the message that just ended was a user or
  // tool message (observe_next_).
  absl::Status ProbeObservation();
  // A generated turn's prompt (header, answer prefix) prefilled: `logits`
  // predicts the turn's first token.
  absl::Status BeginGeneratedTurn(std::string_view intent, std::string_view answer_prefix,
                                  std::vector<float>* logits, TurnResult* r);
  // Closes the turn as the template would have rendered it.
  void EndGeneratedTurn(TurnResult* r);
  bool IsEndOfTurn(int32_t id) const;
  // Takes token `id`, chosen at `step`, into the turn: true when it is to
  // be fed back to the model (the turn goes on).
  bool Accept(int32_t id, int step, int max_new_tokens, TurnResult* r) const;

  const LoadedModel* m_;
  KvStore* store_;
  const ConversationOptions options_;
  Sampler sampler_;
  ChatTokenizer chat_;  // Rendered and tokenized prompt pieces.
  std::vector<StepToken> pending_;
  std::vector<int32_t> repeat_prompt_;  // ProbeReconstruction's prompt, encoded once
  std::vector<StepToken> last_prefilled_;  // up to observation_window, oldest first
  bool observe_next_ = false;  // the latest message was a user or tool message
  // Prefilled since the last generated turn (its prompt_tokens, prefill_seconds).
  int64_t prefilled_tokens_ = 0;
  double prefill_seconds_ = 0;
  int64_t attached_tokens_ = 0;
  bool prefix_tried_ = false;  // share_prefix: attaching was tried
  double attach_seconds_ = 0;
  int32_t next_position_ = 0;
  int32_t turn_ = 0;          // Index of the next message.
  int32_t end_of_turn_id_ = -1;
};

}  // namespace polykv::worker
