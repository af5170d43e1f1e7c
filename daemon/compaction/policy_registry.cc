#include "daemon/compaction/policy_registry.h"

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

absl::Status ValidatePolicyName(const std::string& text) {
  return policies::MakePolicyFromText(text).status();
}

std::string PolicyNote(const std::string& text) {
  auto p = policies::MakePolicyFromText(text);
  if (!p.ok()) return "";
  const policies::LayerAllocator layers = (*p)->Layers();
  // Selecting per layer, each layer holds its own slots and its budget is the
  // allocator's, rounded so that layers differ by whole blocks (compactor.h).
  if (layers == policies::LayerAllocator::kUniform || (*p)->SelectsPerLayer()) return "";
  return absl::StrCat(
      "layers=", std::string(policies::LayerAllocatorName(layers)),
      " acts layer-uniform here: the daemon plans one layer for all layers unless the "
      "policy selects per layer (select=layer, kvzip), where each layer keeps its own budget");
}

absl::StatusOr<const policies::Policy*> PolicyRegistry::Get(const std::string& text) {
  absl::MutexLock lock(&mu_);
  auto it = policies_.find(text);
  if (it != policies_.end()) return it->second.get();
  auto p = policies::MakePolicyFromText(text);
  if (!p.ok()) return p.status();
  return (policies_[text] = *std::move(p)).get();
}

policies::WantedStreams PolicyRegistry::Streams(const std::string& text) {
  auto p = Get(text);
  if (!p.ok()) return {};
  return {(*p)->Reads(), (*p)->SelectsPerLayer(), static_cast<float>((*p)->AttentionDecay())};
}

size_t PolicyRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return policies_.size();
}

}  // namespace polykv::daemon
