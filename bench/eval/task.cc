#include "bench/eval/task.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/worker/conversation.h"
#include "client/worker/json.h"

namespace polykv::eval {
namespace {

using worker::JsonValue;


}  // namespace

absl::StatusOr<Task> ParseTask(const std::string& file, const std::string& text,
                               int default_max_new_tokens) {
  Task task;
  task.file = file;
  task.id = std::filesystem::path(file).stem().string();
  task.family = "script";
  task.eval_json = "null";
  std::vector<TaskMessage> messages;
  int line_no = 0, last_generate = -1;
  std::string last_id, last_eval = "null", last_family;
  for (absl::string_view piece : absl::StrSplit(text, '\n')) {
    const std::string_view line(piece.data(), piece.size());
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const auto where = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(file, ":", line_no, ": ", std::string(why)));
    };
    auto parsed = worker::ParseJson(line);
    if (!parsed.ok()) return where(parsed.status().message());
    if (!parsed->is_object()) return where("expected a JSON object");
    const auto& o = *parsed;
    const auto str = [&](const char* key, std::string* out) {
      auto it = o.find(key);
      if (it != o.end() && it->is_string()) *out = it->get_ref<const std::string&>();
      return it != o.end();
    };
    TaskMessage m;
    std::string role;
    if (!str("role", &role)) return where("missing \"role\"");
    auto r = worker::ParseRole(role);
    if (!r.ok()) return where(r.status().message());
    m.role = *r;
    str("intent", &m.intent);
    if (!str("content", &m.content)) {
      if (m.role != worker::Role::kAssistant) return where("only an assistant line may omit \"content\"");
      m.generate = true;
      str("answer_prefix", &m.answer_prefix);
      m.max_new_tokens = default_max_new_tokens;
      if (auto it = o.find("max_new_tokens"); it != o.end()) {
        if (!it->is_number() || it->get<double>() < 1) {
          return where("\"max_new_tokens\" must be a positive number");
        }
        m.max_new_tokens = static_cast<int>(it->get<double>());
      }
      last_generate = static_cast<int>(messages.size());
      last_id.clear();
      if (auto it = o.find("id"); it != o.end() && it->is_string()) last_id = it->get_ref<const std::string&>();
      last_eval = "null";
      last_family.clear();
      if (auto it = o.find("eval"); it != o.end()) {
        if (!it->is_object()) return where("\"eval\" must be an object");
        last_eval = it->dump();
        if (auto f = it->find("family");
            f != it->end() && f->is_string()) {
          last_family = f->get_ref<const std::string&>();
        }
      }
    }
    messages.push_back(std::move(m));
  }
  if (last_generate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": no assistant line without \"content\" (the turn to evaluate)"));
  }
  task.generation = messages[last_generate];
  if (!last_id.empty()) task.id = last_id;
  if (!last_family.empty()) task.family = last_family;
  task.eval_json = last_eval;
  int context_end = last_generate;
  if (last_generate > 0 && messages[last_generate - 1].role == worker::Role::kUser) {
    task.has_question = true;
    task.question = messages[last_generate - 1];
    context_end = last_generate - 1;
  }
  task.context.assign(messages.begin(), messages.begin() + context_end);
  if (task.context.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": no context before the question"));
  }
  return task;
}

absl::StatusOr<std::vector<std::string>> ListTaskFiles(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      std::vector<std::string> files;
      for (const auto& e : std::filesystem::directory_iterator(p, ec)) {
        if (e.is_regular_file() && e.path().extension() == ".jsonl") files.push_back(e.path().string());
      }
      if (ec) return absl::NotFoundError(absl::StrCat(p, ": ", ec.message()));
      std::sort(files.begin(), files.end());
      if (files.empty()) return absl::NotFoundError(absl::StrCat(p, ": no *.jsonl task files"));
      out.insert(out.end(), files.begin(), files.end());
    } else if (std::filesystem::is_regular_file(p, ec)) {
      out.push_back(p);
    } else {
      return absl::NotFoundError(absl::StrCat(p, ": no such task file or directory"));
    }
  }
  return out;
}

}  // namespace polykv::eval
