// Input checks shared by the pool's entry points. Each returns
// INVALID_ARGUMENT (CheckCanMap: FAILED_PRECONDITION) with a message that
// tells the caller what to change.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

// The longest agent id and tenant name a session (or the config) may use.
inline constexpr size_t kMaxNameLen = 128;
inline constexpr size_t kMaxTenantLen = 64;

// 1..max_len characters of [A-Za-z0-9_.:-].
absl::Status ValidateName(absl::string_view what, absl::string_view value, size_t max_len);
absl::Status ValidateProfile(const ModelProfile& profile);
// Power of two in [1, 256].
absl::Status ValidateBlockTokens(uint32_t block_tokens);
// 0 (none) or in (0, 1]; NaN and infinities refused.
absl::Status ValidateBudgetFraction(double fraction);
// The worker can map this pool's arenas (`can_map` empty: it did not say).
absl::Status CheckCanMap(const std::vector<ArenaKind>& can_map, ArenaKind pool_kind);

}  // namespace polykv::daemon
