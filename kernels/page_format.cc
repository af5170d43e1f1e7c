#include "kernels/page_format.h"

#include "kernels/page_layout.h"

namespace polykv::kernels {

std::string_view FormatName(PageFormat format) {
  switch (format) {
    case PageFormat::kF32: return "f32.v2";
    case PageFormat::kF16: return "f16.v2";
    case PageFormat::kBF16: return "bf16.v2";
    case PageFormat::kFP8E4M3: return "fp8e4m3.v2";
    case PageFormat::kInt8: return "int8.v2";
    case PageFormat::kInt4: return "int4.v2";
    case PageFormat::kInt2: return "int2.v2";
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
  for (int v = 1; IsValidFormat(v); ++v) {
    auto f = static_cast<PageFormat>(v);
    if (FormatShortName(f) == s) return f;
  }
  return std::nullopt;
}

std::string FormatShortNames(std::string_view separator) {
  std::string out;
  for (int v = 1; IsValidFormat(v); ++v) {
    if (v > 1) out += separator;
    out += FormatShortName(static_cast<PageFormat>(v));
  }
  return out;
}

// The host API over page_layout.h's definitions (shared with device code).
bool IsValidFormat(int v) { return v >= 0 && v <= 255 && IsValidFormatValue(PageFormat(v)); }

int FormatBits(PageFormat format) { return BitsOf(format); }

size_t PageBytes(PageFormat format, KvKind kind, const PageShape& s) {
  // The layout (data, f16 scale/zero pairs, padding) lives in page_layout.h so
  // that host and device code share it; see docs/formats.md.
  const PageGeom g = GeomOf(s);
  if (!g.Supports(format, kind)) return 0;
  return g.PageBytes(format, kind);
}

}  // namespace polykv::kernels
