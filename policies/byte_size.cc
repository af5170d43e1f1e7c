#include "policies/byte_size.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace polykv::policies {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  std::string t(absl::StripAsciiWhitespace(text));
  struct Suffix {
    const char* s;
    uint64_t mult;
  };
  static const Suffix kSuffixes[] = {{"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10},
                                     {"G", 1ull << 30},   {"M", 1ull << 20},   {"K", 1ull << 10},
                                     {"B", 1}};
  uint64_t mult = 1;
  for (const auto& s : kSuffixes) {
    const std::string sv(s.s);
    if (t.size() > sv.size() && t.compare(t.size() - sv.size(), sv.size(), sv) == 0) {
      mult = s.mult;
      t.resize(t.size() - sv.size());
      break;
    }
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(t, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a byte size (examples: 1073741824, 1GiB, 512MiB)"));
  }
  if (n > UINT64_MAX / mult) return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large"));
  return n * mult;
}

}  // namespace polykv::policies
