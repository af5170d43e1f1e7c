// Runs one task under every cache configuration: prefill the context once
// (full f32 cache, scores captured), probe the intent, build the policy view,
// then per configuration compress that one prefill and answer the question.
// The reference configuration (full@1/f16) runs first; the others run on
// `threads` threads and are compared with it token by token.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/eval/cache_config.h"
#include "bench/eval/task.h"
#include "client/worker/conversation.h"
#include "client/worker/logprobs.h"

namespace polykv::eval {

struct RunnerOptions {
  int threads = 1;          // configurations answered concurrently
  int prefill_chunk = 128;  // tokens per prefill step of the shared context
  // Besides its own answer, every configuration is teacher-forced on the
  // reference's answer (client/worker/logprobs.h): kl_mean, top1_agreement.
  bool teacher_force = true;
  int logprobs_top = 64;    // the reference's top-k per position
  // The configurations' answers decoded together (Conversation::
  // GenerateBatch: the same tokens, the weights read once per step for all).
  bool batch_decode = true;
};

struct TaskProgress {
  std::string stage;  // "prefill", "config"
  int done = 0, total = 0;
};

// One JSON line per configuration, in `configs` order (the reference added
// first when missing). A configuration that fails (a policy that cannot fit
// its budget) gets a record with "error" instead of an answer; a failure of
// the reference or of the prefill fails the task.
absl::StatusOr<std::vector<std::string>> RunTask(
    const worker::LoadedModel& model, const Task& task, const std::vector<CacheConfig>& configs,
    const RunnerOptions& options, const std::function<void(const TaskProgress&)>& progress = {});

}  // namespace polykv::eval
