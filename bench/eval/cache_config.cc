#include "bench/eval/cache_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace polykv::eval {
namespace {

// KIVI keeps R = 128 recent tokens unquantized at 2 bits.
constexpr int kInt2Residual = 128;

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
        " (expected policy@budget/formats[/T<n>], e.g. h2o@0.25/K8V4)"));
  };
  CacheConfig c;
  std::string_view spec = text;  // without the /T<n> suffix
  size_t slash = spec.rfind('/');
  if (slash != std::string_view::npos && slash + 1 < spec.size() && spec[slash + 1] == 'T') {
    const std::string_view t = spec.substr(slash + 2);
    if (!absl::SimpleAtoi(std::string(t), &c.block_tokens) || c.block_tokens < 1 || c.block_tokens > 256 ||
        (c.block_tokens & (c.block_tokens - 1)) != 0) {
      return fail("T<n>: tokens per page must be a power of two in 1..256");
    }
    spec = spec.substr(0, slash);
    slash = spec.rfind('/');
  }
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
  c.text = absl::StrCat(c.policy, "@", absl::StrFormat("%g", c.budget), "/", c.formats);
  if (c.block_tokens != kDefaultBlockTokens) absl::StrAppend(&c.text, "/T", c.block_tokens);
  return c;
}

}  // namespace polykv::eval
