#include "daemon/pool/validation.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace polykv::daemon {

absl::Status ValidateName(absl::string_view what, absl::string_view value, size_t max_len) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is required"));
  if (value.size() > max_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", value.size(), " characters; at most ", max_len, " allowed"));
  }
  for (char c : value) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) {
      // A byte outside printable ASCII is shown as a number, so the message
      // stays valid UTF-8 whatever the caller sent.
      const bool printable = c >= 0x20 && c < 0x7f;
      return absl::InvalidArgumentError(absl::StrCat(
          what, " may contain only letters, digits and _.:- (got ",
          printable ? absl::StrCat("'", std::string(1, c), "'")
                    : absl::StrCat("byte 0x", absl::Hex(static_cast<unsigned char>(c))),
          ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateProfile(const ModelProfile& p) {
  auto range = [](absl::string_view field, uint32_t v) -> absl::Status {
    if (v < 1 || v > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile.", field, " must be in 1..1024 (got ", v, ")"));
    }
    return absl::OkStatus();
  };
  if (auto s = range("num_layers", p.num_layers); !s.ok()) return s;
  if (auto s = range("num_kv_heads", p.num_kv_heads); !s.ok()) return s;
  if (auto s = range("head_dim", p.head_dim); !s.ok()) return s;
  if (p.model_id.size() > 256) return absl::InvalidArgumentError("profile.model_id over 256 chars");
  return absl::OkStatus();
}

absl::Status ValidateBlockTokens(uint32_t b) {
  if (b < 1 || b > 256 || (b & (b - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_tokens must be a power of two in 1..256 (got ", b, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckCanMap(const std::vector<ArenaKind>& can_map, ArenaKind pool_kind) {
  if (can_map.empty() || std::find(can_map.begin(), can_map.end(), pool_kind) != can_map.end()) {
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (ArenaKind k : can_map) names.emplace_back(ArenaKindName(k));
  return absl::FailedPreconditionError(absl::StrCat(
      "this polykvd keeps its pages in ", ArenaKindName(pool_kind),
      " and this worker can map only ", absl::StrJoin(names, ", "),
      OnDevice(pool_kind) ? " (a worker built with CUDA, on a node with a GPU, can map them)"
                          : " (run it against a polykvd with --tier cuda)"));
}

absl::Status ValidateBudgetFraction(double fraction) {
  // Written as a negated range so that NaN fails too.
  if (!(fraction >= 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget_fraction must be 0 (none) or in (0, 1], the share of a session's context its "
        "policy keeps (got ", fraction, ")"));
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
