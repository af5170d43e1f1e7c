// Byte sizes as people write them in configs and on command lines. The one
// parser for polykvd's config and flags and for polykvctl (both may include
// policies/; QoS budgets are byte sizes).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace polykv::policies {

// "1073741824", "1GiB", "512MiB", "64KiB", "2G", "10M", "4K", "100B"
// (binary units; surrounding whitespace ignored). INVALID_ARGUMENT, naming the
// text, for anything else or a value over 2^64 - 1.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace polykv::policies
