// Page formats: what one KV page holds and how many bytes it takes.
//
// A page holds `block_tokens` tokens x num_kv_heads x head_dim values of ONE
// layer's keys OR values, in one format. The byte size returned here is the
// whole page (data + scales), rounded up to kPageAlignment, and is what the
// daemon's allocator turns into a size class.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace polykv::kernels {

// Every page starts on a 256-byte boundary (coalesced device loads, AVX-512 lines).
inline constexpr size_t kPageAlignment = 256;

// Wire values are stable: they appear in the proto API and in page headers.
enum class PageFormat : uint8_t {
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kFP8E4M3 = 4,
  kInt8 = 5,
  kInt4 = 6,
  kInt2 = 7,
};

// Compute dtype of a worker's model; a session's default page format follows
// it. Wire values are stable: they appear in the proto API.
enum class DType : uint8_t { kF32 = 1, kF16 = 2, kBF16 = 3 };

enum class KvKind : uint8_t { kKey = 0, kValue = 1 };

struct PageShape {
  int block_tokens = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Name of the format's encoding, e.g. "int4.v1". The suffix changes whenever the
// encoding changes, so persisted pages and caches can tell versions apart.
std::string_view FormatName(PageFormat format);
// Short name used in configs, CLIs and metric labels: "f32", "f16", "bf16",
// "fp8", "int8", "int4", "int2".
std::string_view FormatShortName(PageFormat format);
std::optional<PageFormat> ParseFormat(std::string_view short_name);
// Every format's short name in wire order, joined by `separator`
// ("f32 f16 bf16 fp8 int8 int4 int2"): the one list help texts and errors
// print, so none is written by hand.
std::string FormatShortNames(std::string_view separator = " ");
bool IsValidFormat(int wire_value);
// Bits per stored element (scales excluded): 32, 16, 16, 8, 8, 4, 2.
int FormatBits(PageFormat format);

// Bytes of one page of `kind` in `format` for `shape`, including scales,
// rounded up to kPageAlignment. Returns 0 when the shape is invalid:
// non-positive dimensions, head_dim not a multiple of 8 for int4/int2, or not
// a multiple of kValueGroup (32, page_layout.h) for VALUE pages in fp8/int8/
// int4/int2. The layout itself is in kernels/page_layout.h.
size_t PageBytes(PageFormat format, KvKind kind, const PageShape& shape);

}  // namespace polykv::kernels
