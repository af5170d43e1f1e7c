#include "client/worker/chat_template.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace polykv::worker {
namespace {

// Qwen2.5's system-turn text around the tool schemas, as rendered; FromGguf
// checks that the template holds exactly these (as Jinja string literals),
// so a different wording is refused rather than silently rendered wrong.
constexpr char kQwenToolsHead[] =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
// The 1.5B file's template doubles the braces of the example call (they are
// inside a string literal, so they render doubled); the 0.5B's does not.
constexpr const char* kQwenToolsTails[] = {
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n",
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n",
};

// `text` as the body of a double-quoted Jinja string literal.
std::string JinjaDoubleQuoted(const std::string& text) {
  return absl::StrReplaceAll(text, {{"\\", "\\\\"}, {"\n", "\\n"}, {"\"", "\\\""}});
}

// The default system prompt: the first "<|im_start|>system\n...<|im_end|>"
// literal in the template whose body is plain text (no quotes or Jinja).
// The template may write the newline raw (SmolLM2) or as "\n" (Qwen).
std::string FindDefaultSystem(const std::string& tmpl) {
  for (const std::string_view marker : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t at = tmpl.find(marker); at != std::string::npos; at = tmpl.find(marker, at + 1)) {
      const size_t begin = at + marker.size();
      const size_t end = tmpl.find("<|im_end|>", begin);
      if (end == std::string::npos) break;
      const std::string body = tmpl.substr(begin, end - begin);
      if (body.find_first_of("'\"{}") == std::string::npos) {
        return absl::StrReplaceAll(body, {{"\\n", "\n"}});
      }
    }
  }
  return "";
}

absl::StatusOr<ToolCall> ToolCallFromJson(const JsonValue& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("each tool call must be an object");
  const JsonValue* call = &json;
  // The template's own rule: `if tool_call.function is defined`.
  if (auto f = json.find("function"); f != json.end()) call = &*f;
  if (!call->is_object()) return absl::InvalidArgumentError("tool call \"function\" must be an object");
  ToolCall out;
  auto name = call->find("name");
  if (name == call->end() || !name->is_string()) {
    return absl::InvalidArgumentError("a tool call needs a string \"name\"");
  }
  out.name = name->get_ref<const std::string&>();
  auto args = call->find("arguments");
  if (args == call->end()) {
    return absl::InvalidArgumentError(absl::StrCat("tool call ", out.name, " has no \"arguments\""));
  }
  out.arguments = *args;
  return out;
}

// The role as the template names it: the policies' names, except that a
// tool's output is "tool".
std::string ChatRoleName(Role role) {
  return std::string(role == Role::kToolOutput ? "tool" : policies::RoleName(role));
}

}  // namespace

absl::StatusOr<ChatMessage> ChatMessageFromJson(const JsonValue& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("a message must be a JSON object");
  const auto& o = json;
  ChatMessage m;
  auto role = o.find("role");
  if (role == o.end() || !role->is_string()) {
    return absl::InvalidArgumentError("a message needs a string \"role\"");
  }
  const std::string& r = role->get_ref<const std::string&>();
  if (r == "system") {
    m.role = Role::kSystem;
  } else if (r == "user") {
    m.role = Role::kUser;
  } else if (r == "assistant") {
    m.role = Role::kAssistant;
  } else if (r == "tool") {
    m.role = Role::kToolOutput;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown role \"", r, "\" (expected system, user, tool or assistant)"));
  }
  if (auto c = o.find("content"); c != o.end()) {
    if (!c->is_string()) return absl::InvalidArgumentError("\"content\" must be a string");
    m.content = c->get_ref<const std::string&>();
  }
  if (auto t = o.find("tool_calls"); t != o.end()) {
    if (m.role != Role::kAssistant) {
      return absl::InvalidArgumentError("only an assistant message may carry \"tool_calls\"");
    }
    if (!t->is_array()) return absl::InvalidArgumentError("\"tool_calls\" must be an array");
    for (const JsonValue& c : t->get<std::vector<JsonValue>>()) {
      auto call = ToolCallFromJson(c);
      if (!call.ok()) return call.status();
      m.tool_calls.push_back(std::move(*call));
    }
  }
  return m;
}

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
  t.default_system_ = FindDefaultSystem(*tmpl);
  if (tmpl->find("<tool_call>") != std::string::npos ||
      tmpl->find("<tool_response>") != std::string::npos) {
    // Qwen2.5: the default system prompt appears twice (with and without
    // tools); both tool texts must be the ones rendered below.
    for (const char* tail : kQwenToolsTails) {
      if (tmpl->find(JinjaDoubleQuoted(tail)) != std::string::npos) t.tools_tail_ = tail;
    }
    const bool known = !t.default_system_.empty() &&
                       tmpl->find(absl::StrCat("'", t.default_system_, "'")) != std::string::npos &&
                       tmpl->find(JinjaDoubleQuoted(kQwenToolsHead)) != std::string::npos &&
                       !t.tools_tail_.empty() &&
                       tmpl->find("'\\n<tool_call>\\n{\"name\": \"'") != std::string::npos &&
                       tmpl->find("'\\n<tool_response>\\n'") != std::string::npos;
    if (!known) {
      return absl::UnimplementedError(absl::StrCat(
          file.path(), ": a ChatML template with tool calls that is not Qwen2.5's; only "
                       "Qwen2.5's tool rendering is implemented"));
    }
    t.dialect_ = Dialect::kQwen;
    return t;
  }
  // SmolLM2 inserts its default only when the first message is not system.
  if (tmpl->find("messages[0]['role'] != 'system'") == std::string::npos) t.default_system_.clear();
  return t;
}

std::string ChatTemplate::SystemTurn(const std::string* system,
                                     std::span<const JsonValue> tools) const {
  const std::string& body = system != nullptr ? *system : default_system_;
  if (dialect_ == Dialect::kQwen && !tools.empty()) {
    std::string out = absl::StrCat(start_, "system\n", body, kQwenToolsHead);
    for (const JsonValue& tool : tools) absl::StrAppend(&out, "\n", PythonJsonDumps(tool));
    absl::StrAppend(&out, tools_tail_);
    return out;
  }
  if (system == nullptr && default_system_.empty()) return "";
  return absl::StrCat(start_, "system\n", body, end_, "\n");
}

std::string ChatTemplate::RenderMessage(const ChatMessage& m, std::optional<Role> previous,
                                        std::span<const JsonValue> tools) const {
  std::string out = CloseRun(m.role == Role::kToolOutput ? std::nullopt : previous);
  if (!previous.has_value()) {
    if (m.role == Role::kSystem) return SystemTurn(&m.content, tools);
    out = SystemTurn(nullptr, tools);
  }
  const std::string role = ChatRoleName(m.role);
  if (dialect_ == Dialect::kQwen && m.role == Role::kToolOutput) {
    if (previous != Role::kToolOutput) absl::StrAppend(&out, start_, "user");
    absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
    return out;
  }
  if (dialect_ == Dialect::kQwen && m.role == Role::kAssistant && !m.tool_calls.empty()) {
    absl::StrAppend(&out, start_, role);
    if (!m.content.empty()) absl::StrAppend(&out, "\n", m.content);
    for (const ToolCall& call : m.tool_calls) {
      absl::StrAppend(&out, "\n<tool_call>\n{\"name\": \"", call.name, "\", \"arguments\": ",
                      PythonJsonDumps(call.arguments), "}\n</tool_call>");
    }
    absl::StrAppend(&out, end_, "\n");
    return out;
  }
  absl::StrAppend(&out, start_, role, "\n", m.content, end_, "\n");
  return out;
}

std::string ChatTemplate::GenerationPrompt(std::optional<Role> previous,
                                           std::span<const JsonValue> tools) const {
  std::string out = previous.has_value() ? CloseRun(previous) : SystemTurn(nullptr, tools);
  absl::StrAppend(&out, start_, "assistant\n");
  return out;
}

std::string ChatTemplate::CloseRun(std::optional<Role> previous) const {
  return OpensToolRun(previous) ? absl::StrCat(end_, "\n") : "";
}

std::string ChatTemplate::RenderMessage(std::string_view role, std::string_view content,
                                        bool first) const {
  ChatMessage m;
  m.content = std::string(content);
  if (role == "system") m.role = Role::kSystem;
  if (role == "assistant") m.role = Role::kAssistant;
  if (role == "tool") m.role = Role::kToolOutput;
  return RenderMessage(m, first ? std::nullopt : std::optional<Role>(Role::kUser));
}

std::string ChatTemplate::GenerationPrompt(bool first) const {
  return GenerationPrompt(first ? std::nullopt : std::optional<Role>(Role::kUser));
}

}  // namespace polykv::worker
