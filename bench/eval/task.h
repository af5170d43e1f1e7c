// One evaluation task: a worker script (JSONL chat messages, the format of
// client/worker/README.md) whose LAST assistant line without "content" is the
// turn under test. The user message right before it is the question; every
// message before the question is the context, prefilled once and then
// compressed by each cache configuration without seeing the question. An
// optional "eval" object on the last line says how to score the answer
// (bench/eval/score.py); the harness copies it into every result record.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/worker/kv_store.h"

namespace polykv::eval {

struct TaskMessage {
  worker::Role role = worker::Role::kUser;
  std::string content;
  std::string intent;
  bool generate = false;  // an assistant turn to generate (earlier ones: full cache)
  int max_new_tokens = 0;
  // Generation line only ("answer_prefix"): the start of the answer, given
  // to the model (e.g. "The order number is"), so that a small model's
  // answer is a copy from the context rather than a paraphrase.
  std::string answer_prefix;
};

struct Task {
  std::string id;
  std::string file;
  std::string family;  // eval.family, else "script"
  std::vector<TaskMessage> context;
  bool has_question = false;
  TaskMessage question;    // the user message before the generation line
  TaskMessage generation;  // the turn under test
  std::string eval_json;   // the "eval" object as JSON text, or "null"
};

// Parses one task file's text. Errors name the file and line.
absl::StatusOr<Task> ParseTask(const std::string& file, const std::string& text,
                               int default_max_new_tokens);

// The task files named by `paths`: a directory contributes its *.jsonl files
// (sorted by name), a file itself.
absl::StatusOr<std::vector<std::string>> ListTaskFiles(const std::vector<std::string>& paths);

}  // namespace polykv::eval
