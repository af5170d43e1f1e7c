#include "daemon/compaction/policy_registry.h"

namespace polykv::daemon {

absl::Status ValidatePolicyName(const std::string& text) {
  return policies::MakePolicyFromText(text).status();
}

absl::StatusOr<const policies::Policy*> PolicyRegistry::Get(const std::string& text) {
  absl::MutexLock lock(&mu_);
  auto it = policies_.find(text);
  if (it != policies_.end()) return it->second.get();
  auto p = policies::MakePolicyFromText(text);
  if (!p.ok()) return p.status();
  return (policies_[text] = *std::move(p)).get();
}

}  // namespace polykv::daemon
