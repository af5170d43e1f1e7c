// Capability tokens: 32 bytes from the kernel's CSPRNG, compared in constant
// time; and the number that names one run of the daemon.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace polykv::daemon {

inline constexpr size_t kTokenBytes = 32;

absl::StatusOr<std::string> NewToken();
// Constant-time for equal lengths, so response timing does not leak a prefix.
bool TokenEquals(absl::string_view a, absl::string_view b);

// A nonzero number for this run of polykvd (session ids' high half, offload
// files' names), from the kernel's CSPRNG (the clock if that fails: restarts
// within one second are not the concern then).
uint32_t DrawInstance();

}  // namespace polykv::daemon
