#include "daemon/compaction/policy_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {
namespace {

// "h2o" or "h2o{window.size=32,trigger=1.2}" -> (spec, params).
absl::StatusOr<std::pair<std::string, policies::PolicyParams>> SplitPolicy(
    const std::string& text) {
  const size_t brace = text.find('{');
  if (brace == std::string::npos) return std::make_pair(text, policies::PolicyParams{});
  if (text.back() != '}') {
    return absl::InvalidArgumentError(absl::StrCat("policy '", text, "': missing closing '}'"));
  }
  auto params = policies::ParseParams(text.substr(brace + 1, text.size() - brace - 2));
  if (!params.ok()) return params.status();
  return std::make_pair(text.substr(0, brace), *std::move(params));
}

absl::StatusOr<std::unique_ptr<policies::Policy>> Make(const std::string& text) {
  auto split = SplitPolicy(text);
  if (!split.ok()) return split.status();
  return policies::MakePolicy(split->first, split->second);
}

}  // namespace

absl::Status ValidatePolicyName(const std::string& text) {
  auto split = SplitPolicy(text);
  if (!split.ok()) return split.status();
  auto p = policies::MakePolicy(split->first, split->second);
  if (!p.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy '", text, "': ", std::string(p.status().message())));
  }
  return absl::OkStatus();
}

absl::StatusOr<const policies::Policy*> PolicyRegistry::Get(const std::string& text) {
  absl::MutexLock lock(&mu_);
  auto it = policies_.find(text);
  if (it != policies_.end()) return it->second.get();
  auto p = Make(text);
  if (!p.ok()) return p.status();
  return (policies_[text] = *std::move(p)).get();
}

}  // namespace polykv::daemon
