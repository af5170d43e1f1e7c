// A conversation's prompt as token ids, built piece by piece: each message
// is rendered by the ChatTemplate given the role before it, then tokenized so
// that the ids equal tokenizing the whole rendered conversation at once (what
// Hugging Face's apply_chat_template + tokenizer give). Conversation feeds the
// model from here; tests check the equality against the fixtures.
//
// Why text is held back: BPE pre-tokenization can merge across a piece
// boundary. Qwen's consecutive tool responses join as
// "...</tool_response>" + "\n<tool_response>...", whose ">\n" is one
// pre-token of the whole text. A boundary next to a special token
// ("<|im_start|>", "<|im_end|>") is always safe, so the text after the last
// special token of a piece is held until the next piece starts with one (or
// the prompt is flushed for the model).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/worker/chat_template.h"
#include "client/worker/json.h"
#include "client/worker/kv_store.h"
#include "client/worker/tokenizer.h"

namespace polykv::worker {

// A prompt token and the message it came from.
struct TaggedToken {
  int32_t id = 0;
  int32_t turn = 0;
  Role role = Role::kUser;
};

// Copyable (Conversation::Fork copies it). The template and tokenizer are
// borrowed and must outlive it; a null tokenizer renders text only (no
// tokens: template tests for models whose tokenizer is not supported yet).
// Not thread-safe.
class ChatTokenizer {
 public:
  ChatTokenizer(const ChatTemplate* chat_template, const Tokenizer* tokenizer)
      : t_(chat_template), tok_(tokenizer) {}

  // The tools (JSON Schemas) the system turn declares. REQUIRES: nothing
  // rendered yet (FailedPrecondition otherwise).
  absl::Status SetTools(std::vector<JsonValue> tools);

  // Each call renders one piece, appends the tokens that are now final to
  // *out (tagged with `turn`), and returns the piece's text.
  std::string AddMessage(const ChatMessage& m, int32_t turn, std::vector<TaggedToken>* out);
  // The generation prompt; flushes, since generated ids follow.
  std::string AddGenerationPrompt(int32_t turn, std::vector<TaggedToken>* out);
  // After a generated turn whose ids (end token included) the caller queued
  // itself: the template's text after the end token, as an assistant message.
  std::string AddAfterGeneratedTurn(int32_t turn, std::vector<TaggedToken>* out);
  // Ends the text without a generation prompt (closes an open tool run) and
  // flushes: the fixtures' add_generation_prompt=false.
  std::string Close(std::vector<TaggedToken>* out);
  // Tokenizes the held text now. A tool message added after a Flush in the
  // middle of a tool run may tokenize its first bytes differently from the
  // whole text (see above); Conversation flushes only before the model runs.
  void Flush(std::vector<TaggedToken>* out);

  std::optional<Role> previous() const { return previous_; }

 private:
  struct Segment {
    size_t end;  // Offset in held_ one past the segment.
    int32_t turn;
    Role role;
  };
  // Appends `piece`, flushing first when it starts at a special token, then
  // tokenizes up to the end of the last special token in the held text.
  void Append(const std::string& piece, int32_t turn, Role role, std::vector<TaggedToken>* out);
  // Tokenizes held_[0, n) and drops it from held_.
  void Emit(size_t n, std::vector<TaggedToken>* out);
  // Emits a message's leading CloseRun text under the run's own turn.
  std::string AppendRendered(const std::string& text, int32_t turn, Role role,
                             std::vector<TaggedToken>* out);

  const ChatTemplate* t_;
  const Tokenizer* tok_;
  std::vector<JsonValue> tools_;
  std::optional<Role> previous_;  // Role of the last piece; nullopt: nothing yet.
  int32_t previous_turn_ = 0;
  std::string held_;                // Rendered, not yet tokenized.
  std::vector<Segment> segments_;   // Which turn each byte range of held_ is from.
};

}  // namespace polykv::worker
