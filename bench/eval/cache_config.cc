#include "bench/eval/cache_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace polykv::eval {
namespace {

// KIVI keeps R = 128 recent tokens unquantized at 2 bits.
constexpr int kInt2Residual = 128;
constexpr int kMaxRecentTokens = 1 << 16;

std::optional<kernels::PageFormat> IntFormat(char bits) {
  switch (bits) {
    case '8': return kernels::PageFormat::kInt8;
    case '4': return kernels::PageFormat::kInt4;
    case '2': return kernels::PageFormat::kInt2;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<CacheConfig> ParseCacheConfig(std::string_view text) {
  const auto fail = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache config \"", std::string(text), "\": ", std::string(why),
        " (expected policy@budget/formats[/T<n>][/R<n>], e.g. h2o@0.25/K8V4)"));
  };
  CacheConfig c;
  // Trailing /T<n> and /R<n>, each at most once, in either order.
  std::string_view spec = text;  // without them
  bool has_t = false, has_r = false;
  int recent = -1;
  for (size_t slash = spec.rfind('/'); slash != std::string_view::npos && slash + 1 < spec.size();
       slash = spec.rfind('/')) {
    const char what = spec[slash + 1];
    if (what != 'T' && what != 'R') break;
    bool& seen = what == 'T' ? has_t : has_r;
    int value = 0;
    if (seen || !absl::SimpleAtoi(std::string(spec.substr(slash + 2)), &value)) {
      return fail(what == 'T' ? "T<n>: a number of tokens per page, given once"
                              : "R<n>: a number of recent tokens kept in f16, given once");
    }
    seen = true;
    if (what == 'T') {
      if (value < 1 || value > 256 || (value & (value - 1)) != 0) {
        return fail("T<n>: tokens per page must be a power of two in 1..256");
      }
      c.block_tokens = value;
    } else {
      if (value < 0 || value > kMaxRecentTokens) {
        return fail(absl::StrCat("R<n>: the f16 recent window must be 0..", kMaxRecentTokens,
                                 " tokens"));
      }
      recent = value;
    }
    spec = spec.substr(0, slash);
  }
  const size_t slash = spec.rfind('/');
  const size_t at = spec.find('@');
  if (at == std::string_view::npos || slash == std::string_view::npos || slash < at || at == 0) {
    return fail("malformed");
  }
  c.policy = std::string(spec.substr(0, at));
  if (!absl::SimpleAtod(std::string(spec.substr(at + 1, slash - at - 1)), &c.budget) || !(c.budget > 0) ||
      c.budget > 1) {
    return fail("budget must be a number in (0, 1]");
  }
  if (c.full()) c.budget = 1.0;
  c.formats = std::string(spec.substr(slash + 1));
  if (c.formats == "f32") {
    c.k_format = c.v_format = c.append_format = kernels::PageFormat::kF32;
  } else if (c.formats == "f16") {
    c.k_format = c.v_format = c.append_format = kernels::PageFormat::kF16;
  } else if (c.formats.size() == 4 && c.formats[0] == 'K' && c.formats[2] == 'V' &&
             IntFormat(c.formats[1]) && IntFormat(c.formats[3])) {
    c.k_format = *IntFormat(c.formats[1]);
    c.v_format = *IntFormat(c.formats[3]);
    if (c.k_format == kernels::PageFormat::kInt2 || c.v_format == kernels::PageFormat::kInt2) {
      c.f16_tail = kInt2Residual;
    }
  } else {
    return fail("formats must be f32, f16 or K<8|4|2>V<8|4|2>");
  }
  if (recent > 0 && c.append_format == c.k_format && c.append_format == c.v_format) {
    return fail("R<n> keeps recent tokens in f16 beside quantized pages: it needs K<k>V<v>");
  }
  const int default_tail = c.f16_tail;
  if (recent >= 0) c.f16_tail = recent;
  c.text = absl::StrCat(c.policy, "@", absl::StrFormat("%g", c.budget), "/", c.formats);
  if (c.block_tokens != kDefaultBlockTokens) absl::StrAppend(&c.text, "/T", c.block_tokens);
  if (c.f16_tail != default_tail) absl::StrAppend(&c.text, "/R", c.f16_tail);
  return c;
}

}  // namespace polykv::eval
