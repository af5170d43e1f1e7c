#include "kernels/page_format.h"

namespace polykv::kernels {
namespace {

size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Quantized layouts (see docs/formats.md):
//  keys   — per channel over the page's tokens (KIVI): one (scale, zero) pair of
//           f32 per (head, channel);
//  values — per token in groups of kValueGroup channels: one (scale, zero)
//           pair of f32 per (token, head, group).
constexpr int kValueGroup = 32;

}  // namespace

std::string_view FormatName(PageFormat format) {
  switch (format) {
    case PageFormat::kF32: return "f32.v1";
    case PageFormat::kF16: return "f16.v1";
    case PageFormat::kBF16: return "bf16.v1";
    case PageFormat::kFP8E4M3: return "fp8e4m3.v1";
    case PageFormat::kInt8: return "int8.v1";
    case PageFormat::kInt4: return "int4.v1";
    case PageFormat::kInt2: return "int2.v1";
  }
  return "invalid";
}

std::string_view FormatShortName(PageFormat format) {
  switch (format) {
    case PageFormat::kF32: return "f32";
    case PageFormat::kF16: return "f16";
    case PageFormat::kBF16: return "bf16";
    case PageFormat::kFP8E4M3: return "fp8";
    case PageFormat::kInt8: return "int8";
    case PageFormat::kInt4: return "int4";
    case PageFormat::kInt2: return "int2";
  }
  return "invalid";
}

std::optional<PageFormat> ParseFormat(std::string_view s) {
  for (int v = 1; v <= 7; ++v) {
    auto f = static_cast<PageFormat>(v);
    if (FormatShortName(f) == s) return f;
  }
  return std::nullopt;
}

bool IsValidFormat(int v) { return v >= 1 && v <= 7; }

int FormatBits(PageFormat format) {
  switch (format) {
    case PageFormat::kF32: return 32;
    case PageFormat::kF16:
    case PageFormat::kBF16: return 16;
    case PageFormat::kFP8E4M3:
    case PageFormat::kInt8: return 8;
    case PageFormat::kInt4: return 4;
    case PageFormat::kInt2: return 2;
  }
  return 0;
}

size_t PageBytes(PageFormat format, KvKind kind, const PageShape& s) {
  if (s.block_tokens <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0) return 0;
  const int bits = FormatBits(format);
  if (bits == 0) return 0;
  const size_t elems = size_t(s.block_tokens) * s.num_kv_heads * s.head_dim;
  size_t bytes = (elems * bits + 7) / 8;
  const bool quantized = format == PageFormat::kInt8 || format == PageFormat::kInt4 ||
                         format == PageFormat::kInt2;
  if (quantized) {
    if (kind == KvKind::kKey) {
      bytes += size_t(s.num_kv_heads) * s.head_dim * 2 * sizeof(float);
    } else {
      if (s.head_dim % kValueGroup != 0) return 0;
      bytes += size_t(s.block_tokens) * s.num_kv_heads * (s.head_dim / kValueGroup) * 2 *
               sizeof(float);
    }
  } else if (format == PageFormat::kFP8E4M3) {
    bytes += size_t(s.num_kv_heads) * sizeof(float);  // one scale per head
  }
  return RoundUp(bytes, kPageAlignment);
}

}  // namespace polykv::kernels
