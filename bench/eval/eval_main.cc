// polykv-eval: answers every task's question under every cache configuration
// and writes one JSON record per (task, configuration). Scoring, statistics
// and plots are bench/eval/score.py and report.py; bench/eval/eval.py runs
// the whole pipeline. See bench/eval/README.md.
#include <cblas.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/worker/clock.h"
#include "client/worker/blas_core.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench/eval/cache_config.h"
#include "bench/eval/runner.h"
#include "bench/eval/task.h"
#include "client/worker/conversation.h"
#include "client/worker/json.h"

namespace {

using namespace polykv;

int Fail(const std::string& msg) {
  std::fprintf(stderr, "polykv-eval: %s\n", msg.c_str());
  return 1;
}

// A task file's path as --resume compares it: the same file named relative
// or absolute is one task.
std::string CanonicalPath(const std::string& path) {
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// Tasks already complete in an earlier run's output (every configuration
// has a record), so an interrupted run resumes where it stopped.
std::set<std::string> CompletedTasks(const std::string& path, size_t configs) {
  std::ifstream in(path);
  std::map<std::string, std::set<std::string>> seen;
  std::string line;
  while (std::getline(in, line)) {
    auto v = worker::ParseJson(line);
    if (!v.ok() || !v->is_object()) continue;
    const auto& o = *v;
    auto t = o.find("file"), c = o.find("config");
    if (t == o.end() || c == o.end() || !t->is_string() || !c->is_string()) continue;
    seen[CanonicalPath(t->get_ref<const std::string&>())].insert(c->get_ref<const std::string&>());
  }
  std::set<std::string> done;
  for (const auto& [task, cs] : seen) {
    if (cs.size() >= configs) done.insert(task);
  }
  return done;
}

}  // namespace

int main(int argc, char** argv) {
  polykv::worker::UseFastBlasKernels(argv);
  CLI::App app{"polykv-eval: task answers under cache configurations (policy x budget x K/V formats)"};
  std::vector<std::string> task_paths;
  std::string configs_text, configs_file, out_path, model_path = worker::DefaultModelPath();
  int threads = 2, prefill_chunk = 128, default_max_new = 64, limit = 0;
  bool resume = false, no_teacher_force = false, no_batch_decode = false;
  int logprobs_top = 64;
  app.add_option("--tasks", task_paths, "task files (*.jsonl) or directories of them")->required();
  app.add_option("--configs", configs_text,
                 "comma-separated configurations policy@budget/formats[/T<n>][/R<n>], e.g. "
                 "h2o@0.25/K8V4,full@1/f16 (full@1/f16, the reference, always runs)");
  app.add_option("--configs-file", configs_file, "one configuration per line (# comments)");
  app.add_option("--out", out_path, "JSONL result records (appended with --resume)")->required();
  app.add_option("--model", model_path,
                 "GGUF model: a path or a scripts/fetch-model.sh name (qwen2.5-coder-0.5b, ...)")
      ->capture_default_str();
  app.add_option("--threads", threads, "configurations answered concurrently (BLAS threads for the shared prefill)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prefill-chunk", prefill_chunk, "tokens per prefill step")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-new-tokens", default_max_new, "cap for turns that set none")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--limit", limit, "run at most this many tasks (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", resume, "skip tasks --out already holds every configuration of");
  app.add_flag("--no-teacher-force", no_teacher_force,
               "answer only: do not also force each configuration on the reference's answer "
               "(kl_mean, top1_agreement)");
  app.add_flag("--no-batch-decode", no_batch_decode,
               "decode each configuration's answer on its own thread instead of all in one batch "
               "(the same tokens; slower)");
  app.add_option("--logprobs-top", logprobs_top,
                 "the reference's top-k log-probabilities per position that KL is taken over")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);

  std::vector<eval::CacheConfig> configs;
  // Commas inside a policy's braces ("h2o{cold.format=int4,cold.fraction=0.5}@...")
  // do not split configurations.
  std::vector<std::string> texts;
  int depth = 0;
  std::string current;
  for (char ch : configs_text + ",") {
    depth += ch == '{' ? 1 : ch == '}' ? -1 : 0;
    if (ch == ',' && depth <= 0) {
      if (!absl::StripAsciiWhitespace(current).empty()) texts.push_back(current);
      current.clear();
    } else {
      current += ch;
    }
  }
  if (!configs_file.empty()) {
    std::ifstream in(configs_file);
    if (!in) return Fail(absl::StrCat(configs_file, ": cannot read"));
    std::string line;
    while (std::getline(in, line)) {
      const absl::string_view l = absl::StripAsciiWhitespace(line);
      if (l.empty() || l[0] == '#') continue;
      texts.emplace_back(l);
    }
  }
  std::set<std::string> unique;
  for (const std::string& t : texts) {
    const absl::string_view stripped = absl::StripAsciiWhitespace(t);
    auto c = eval::ParseCacheConfig(std::string_view(stripped.data(), stripped.size()));
    if (!c.ok()) return Fail(std::string(c.status().message()));
    if (unique.insert(c->text).second) configs.push_back(*c);
  }
  unique.insert(std::string(eval::kReferenceConfig));

  auto files = eval::ListTaskFiles(task_paths);
  if (!files.ok()) return Fail(std::string(files.status().message()));
  if (limit > 0 && files->size() > static_cast<size_t>(limit)) files->resize(limit);
  std::vector<eval::Task> tasks;
  for (const std::string& f : *files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) return Fail(absl::StrCat(f, ": cannot read"));
    auto t = eval::ParseTask(f, ss.str(), default_max_new);
    if (!t.ok()) return Fail(std::string(t.status().message()));
    tasks.push_back(std::move(*t));
  }

  const std::set<std::string> done = resume ? CompletedTasks(out_path, unique.size()) : std::set<std::string>{};
  std::FILE* out = std::fopen(out_path.c_str(), resume ? "a" : "w");
  if (out == nullptr) return Fail(absl::StrCat(out_path, ": cannot write"));

  if (auto p = worker::ModelPath(model_path); p.ok()) {
    model_path = *p;
  } else {
    std::fprintf(stderr, "polykv-eval: %s\n", std::string(p.status().message()).c_str());
    return 2;
  }
  std::fprintf(stderr, "polykv-eval: loading %s\n", model_path.c_str());
  auto model = worker::LoadModel(model_path);
  if (!model.ok()) {
    return Fail(absl::StrCat(model.status().message(), " (fetch it with: bash scripts/fetch-model.sh)"));
  }
  std::fprintf(stderr, "polykv-eval: %zu tasks x %zu configurations, %d threads\n", tasks.size(),
               unique.size(), threads);
  const double t_start = worker::SteadySeconds();
  eval::RunnerOptions ro;
  ro.threads = threads;
  ro.prefill_chunk = prefill_chunk;
  ro.teacher_force = !no_teacher_force;
  ro.logprobs_top = logprobs_top;
  ro.batch_decode = !no_batch_decode;
  int failed = 0, ran = 0;
  size_t to_run = 0;
  for (const eval::Task& task : tasks) to_run += done.count(CanonicalPath(task.file)) == 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const eval::Task& task = tasks[i];
    if (done.count(CanonicalPath(task.file))) {
      std::fprintf(stderr, "[%zu/%zu] %s: already in %s, skipped\n", i + 1, tasks.size(),
                   task.id.c_str(), out_path.c_str());
      continue;
    }
    const double t0 = worker::SteadySeconds();
    auto records = eval::RunTask(**model, task, configs, ro, [&](const eval::TaskProgress& p) {
      std::fprintf(stderr, "\r[%zu/%zu] %s: %s %d/%d (%.0f s)   ", i + 1, tasks.size(),
                   task.id.c_str(), p.stage.c_str(), p.done, p.total, worker::SteadySeconds() - t0);
      std::fflush(stderr);
    });
    if (!records.ok()) {
      ++failed;
      std::fprintf(stderr, "\n[%zu/%zu] %s FAILED: %s\n", i + 1, tasks.size(), task.id.c_str(),
                   std::string(records.status().message()).c_str());
      continue;
    }
    for (const std::string& r : *records) std::fprintf(out, "%s\n", r.c_str());
    std::fflush(out);
    // The estimate counts only tasks run here, not those --resume skipped.
    const double elapsed = worker::SteadySeconds() - t_start;
    ++ran;
    const size_t left = to_run - std::min<size_t>(to_run, ran + failed);
    std::fprintf(stderr, "\r[%zu/%zu] %s: %zu records in %.0f s; elapsed %.0f s, ~%.0f s left\n",
                 i + 1, tasks.size(), task.id.c_str(), records->size(), worker::SteadySeconds() - t0, elapsed,
                 elapsed / ran * static_cast<double>(left));
  }
  std::fclose(out);
  std::fprintf(stderr, "polykv-eval: wrote %s (%d tasks failed) in %.0f s\n", out_path.c_str(),
               failed, worker::SteadySeconds() - t_start);
  return failed == 0 ? 0 : 2;
}
