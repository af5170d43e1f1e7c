#include "client/worker/chat_template.h"

#include "absl/strings/str_cat.h"

namespace polykv::worker {

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& file) {
  auto tmpl = file.GetString("tokenizer.chat_template");
  if (!tmpl.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": no tokenizer.chat_template; the worker needs a chat model"));
  }
  ChatTemplate t;
  if (tmpl->find("<|im_start|>") == std::string::npos ||
      tmpl->find("<|im_end|>") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": unsupported chat template (only ChatML, <|im_start|>/<|im_end|>)"));
  }
  // SmolLM2 (and Qwen2) templates insert a default system message; take its
  // text from the template so the rendering matches it exactly.
  const std::string marker = "<|im_start|>system\n";
  const size_t at = tmpl->find(marker);
  const bool has_default = tmpl->find("messages[0]['role'] != 'system'") != std::string::npos;
  if (has_default && at != std::string::npos) {
    const size_t begin = at + marker.size();
    const size_t end = tmpl->find("<|im_end|>", begin);
    if (end != std::string::npos) t.default_system_ = tmpl->substr(begin, end - begin);
  }
  return t;
}

std::string ChatTemplate::RenderMessage(std::string_view role, std::string_view content,
                                        bool first) const {
  std::string out;
  if (first && role != "system" && !default_system_.empty()) {
    out = absl::StrCat(start_, "system\n", default_system_, end_, "\n");
  }
  absl::StrAppend(&out, start_, std::string(role), "\n", std::string(content), end_, "\n");
  return out;
}

std::string ChatTemplate::GenerationPrompt(bool first) const {
  std::string out;
  if (first && !default_system_.empty()) {
    out = absl::StrCat(start_, "system\n", default_system_, end_, "\n");
  }
  absl::StrAppend(&out, start_, "assistant\n");
  return out;
}

}  // namespace polykv::worker
