// Capability tokens: 32 bytes from the kernel's CSPRNG, compared in constant time.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace polykv::daemon {

inline constexpr size_t kTokenBytes = 32;

absl::StatusOr<std::string> NewToken();
// Constant-time for equal lengths, so response timing does not leak a prefix.
bool TokenEquals(absl::string_view a, absl::string_view b);

}  // namespace polykv::daemon
