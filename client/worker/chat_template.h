// The model's chat template, rendered message by message so a conversation
// can be fed to the cache incrementally (the concatenation of the pieces is
// exactly what the GGUF's Jinja template renders for the whole conversation,
// as transformers' apply_chat_template does).
//
// Two ChatML dialects ("<|im_start|>ROLE\nCONTENT<|im_end|>\n"), recognised in
// tokenizer.chat_template by FromGguf, which says so plainly for others:
//  * kChatMl (SmolLM2): a default system message when the first message is
//    not "system"; every role rendered alike; tools and tool calls are not in
//    the template, so they are not rendered.
//  * kQwen (Qwen2.5 / Qwen2.5-Coder): default system message; declared tools
//    in the system turn ("# Tools", each schema `| tojson` inside
//    <tools></tools>); an assistant's tool calls as <tool_call> blocks; a run
//    of consecutive tool messages as <tool_response> blocks inside ONE user
//    turn.
//
// Rendering is stateless: each piece is given the role of the message before
// it. A tool run stays open after a tool message; the piece that follows it
// (RenderMessage of a non-tool message, GenerationPrompt or CloseRun) starts
// with the run's "<|im_end|>\n".
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/worker/gguf.h"
#include "client/worker/json.h"
#include "client/worker/kv_store.h"

namespace polykv::worker {

// One call in an assistant message's tool_calls.
struct ToolCall {
  std::string name;
  JsonValue arguments;  // Rendered with `tojson`: an object, or a string as-is quoted.
};

struct ChatMessage {
  Role role = Role::kUser;
  std::string content;              // Missing content renders as "".
  std::vector<ToolCall> tool_calls;  // Assistant messages only; history, not generated.
};

// A message from its JSON form: {"role", "content"?, "tool_calls"?}, each
// tool call {"name", "arguments"} or OpenAI's {"function": {"name",
// "arguments"}}. InvalidArgument naming the field otherwise.
absl::StatusOr<ChatMessage> ChatMessageFromJson(const JsonValue& json);

// Immutable after FromGguf; copyable and thread-safe.
class ChatTemplate {
 public:
  enum class Dialect { kChatMl, kQwen };

  static absl::StatusOr<ChatTemplate> FromGguf(const GgufFile& file);

  // Text of `m` after a message of role `previous` (nullopt: `m` is the
  // first message; then the system turn, with `tools` for kQwen, comes
  // first). `tools` are JSON Schemas in declaration order; only read when
  // `previous` is nullopt.
  std::string RenderMessage(const ChatMessage& m, std::optional<Role> previous,
                            std::span<const JsonValue> tools = {}) const;
  // Opens an assistant turn for generation ("<|im_start|>assistant\n"),
  // closing an open tool run first; the system turn first when `previous` is
  // nullopt.
  std::string GenerationPrompt(std::optional<Role> previous,
                               std::span<const JsonValue> tools = {}) const;
  // What ends the conversation's text after `previous` when no message or
  // generation follows: "<|im_end|>\n" after a kQwen tool run, else "".
  std::string CloseRun(std::optional<Role> previous) const;
  // Closes a generated assistant turn after its end token ("\n").
  std::string AfterEndOfTurn() const { return "\n"; }

  // Single-message conveniences for conversations without tool messages:
  // `first` is previous == nullopt, otherwise the previous role counts as
  // "user".
  std::string RenderMessage(std::string_view role, std::string_view content, bool first) const;
  std::string GenerationPrompt(bool first) const;

  // The token text that ends a turn.
  const std::string& end_of_turn() const { return end_; }
  const std::string& start_of_turn() const { return start_; }
  const std::string& default_system() const { return default_system_; }
  Dialect dialect() const { return dialect_; }

 private:
  bool OpensToolRun(std::optional<Role> previous) const {
    return dialect_ == Dialect::kQwen && previous == Role::kToolOutput;
  }
  // The system turn that precedes the first message; `system` is its
  // content when that message is a system message, else null.
  std::string SystemTurn(const std::string* system, std::span<const JsonValue> tools) const;

  Dialect dialect_ = Dialect::kChatMl;
  std::string start_ = "<|im_start|>";
  std::string end_ = "<|im_end|>";
  std::string default_system_;  // Empty: none.
  std::string tools_tail_;      // Qwen: the system-turn text after the tool schemas.
};

}  // namespace polykv::worker
