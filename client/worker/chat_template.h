// The model's chat template, rendered message by message so a conversation
// can be fed to the cache incrementally (the concatenation of the pieces is
// exactly what the GGUF's Jinja template renders for the whole conversation).
//
// Only the ChatML family is supported ("<|im_start|>ROLE\nCONTENT<|im_end|>\n",
// SmolLM2's template, with its default system prompt when the first message
// is not a system message); FromGguf checks tokenizer.chat_template for it and
// says so plainly otherwise.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "client/worker/gguf.h"

namespace polykv::worker {

class ChatTemplate {
 public:
  static absl::StatusOr<ChatTemplate> FromGguf(const GgufFile& file);

  // Text of one message; `first` adds the default system message before a
  // first message that is not "system".
  std::string RenderMessage(std::string_view role, std::string_view content, bool first) const;
  // Opens an assistant turn for generation ("<|im_start|>assistant\n"),
  // with the default system message first when `first`.
  std::string GenerationPrompt(bool first) const;
  // Closes a generated assistant turn after its end token ("\n").
  std::string AfterEndOfTurn() const { return "\n"; }
  // The token text that ends a turn.
  const std::string& end_of_turn() const { return end_; }
  const std::string& default_system() const { return default_system_; }

 private:
  std::string start_ = "<|im_start|>";
  std::string end_ = "<|im_end|>";
  std::string default_system_;  // Empty: none.
};

}  // namespace polykv::worker
