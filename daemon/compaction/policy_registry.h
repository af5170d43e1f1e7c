// PolicyRegistry: the policies sessions name in their QoS, built once per
// distinct spec text and kept for the daemon's lifetime (a policy is
// immutable and its Decide may run concurrently, policies/policy.h), so the
// pool can decide without its lock.
//
// Thread-safety: thread-safe (its own mutex, never held while deciding).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "policies/policy.h"

namespace polykv::daemon {

// OK when `text` names a policy the daemon can run: a preset or '+'-joined
// components (policies::MakePolicy), optionally with parameters in braces,
// e.g. "h2o{window.size=64}". INVALID_ARGUMENT otherwise.
absl::Status ValidatePolicyName(const std::string& text);

// How the daemon runs the policy `text` differently from its spec, in words
// (QosRecord.policy_note); empty when it runs it as written or the text is
// not a policy. The daemon decides once for all layers (docs/compaction.md),
// or per layer with one budget for each (select=layer), so a per-layer
// allocator acts uniform.
std::string PolicyNote(const std::string& text);

class PolicyRegistry {
 public:
  // The policy for `text`; the pointer stays valid as long as the registry.
  absl::StatusOr<const policies::Policy*> Get(const std::string& text) ABSL_LOCKS_EXCLUDED(mu_);
  // What a worker of a session under the policy `text` should report (its
  // Reads(), per layer when it SelectsPerLayer); none for a text Get refuses.
  policies::WantedStreams Streams(const std::string& text) ABSL_LOCKS_EXCLUDED(mu_);
  // Policies built so far: one per distinct text sessions named (the
  // ladder's steps are typed data, not texts, so they add none).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<policies::Policy>> policies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
