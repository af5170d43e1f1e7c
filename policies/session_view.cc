#include "policies/session_view.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "kernels/page_layout.h"

namespace polykv::policies {
namespace {

constexpr std::array<std::string_view, kNumRoles> kRoleNames = {
    "system", "user", "assistant", "tool_call", "tool_output", "error"};
constexpr std::array<std::string_view, kNumBlockKinds> kKindNames = {
    "none",    "text",      "import",    "signature",   "class", "body",
    "comment", "statement", "tool_call", "tool_output", "error"};

}  // namespace

std::string_view RoleName(Role role) {
  const int i = static_cast<int>(role);
  return i < kNumRoles ? kRoleNames[i] : "unknown";
}

std::optional<Role> ParseRole(std::string_view name) {
  for (int i = 0; i < kNumRoles; ++i) {
    if (kRoleNames[i] == name) return static_cast<Role>(i);
  }
  return std::nullopt;
}

std::string_view BlockKindName(BlockKind kind) {
  const int i = static_cast<int>(kind);
  return i < kNumBlockKinds ? kKindNames[i] : "unknown";
}

std::optional<BlockKind> ParseBlockKind(std::string_view name) {
  for (int i = 0; i < kNumBlockKinds; ++i) {
    if (kKindNames[i] == name) return static_cast<BlockKind>(i);
  }
  return std::nullopt;
}

absl::Status ValidateView(const SessionView& view) {
  if (view.key_dim < 0) return absl::InvalidArgumentError("key_dim < 0");
  for (int l = 0; l < view.num_layers(); ++l) {
    if (auto st = ValidateLayer(view, l); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ValidateLayer(const SessionView& view, int l) {
  if (view.key_dim < 0) return absl::InvalidArgumentError("key_dim < 0");
  {
    const LayerView& layer = view.layers[l];
    int64_t prev = INT64_MIN;
    for (size_t i = 0; i < layer.slots.size(); ++i) {
      const Slot& s = layer.slots[i];
      if (s.token >= view.tokens.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", l, " slot ", i, ": token ", s.token, " out of range"));
      }
      if (s.count < 1) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, " slot ", i, ": count 0"));
      }
      const int64_t pos = view.tokens[s.token].position;
      if (pos <= prev) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", l, " slot ", i, ": positions must be strictly ascending"));
      }
      prev = pos;
      // The inline form of kernels::IsValidFormat: this loop runs over every
      // slot of every layer before each decision.
      if (!kernels::IsValidFormatValue(s.k_format) || !kernels::IsValidFormatValue(s.v_format)) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, " slot ", i, ": bad format"));
      }
    }
    if (!layer.keys.empty() &&
        layer.keys.size() != layer.slots.size() * static_cast<size_t>(view.key_dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": keys must be [num_slots * key_dim]"));
    }
  }
  return absl::OkStatus();
}

double BytesPerToken(const kernels::PageShape& shape, kernels::PageFormat k_format,
                     kernels::PageFormat v_format) {
  if (shape.block_tokens <= 0) return 0;
  const size_t k = kernels::PageBytes(k_format, kernels::KvKind::kKey, shape);
  const size_t v = kernels::PageBytes(v_format, kernels::KvKind::kValue, shape);
  if (k == 0 || v == 0) return 0;
  return static_cast<double>(k + v) / shape.block_tokens;
}

}  // namespace polykv::policies
