// Byte layout of one KV page and of a block table, shared by the CPU reference,
// the fast CPU kernels and the CUDA kernels (every function is __host__
// __device__ under nvcc). docs/formats.md describes the same layout in prose.
//
// A page of shape (T = block_tokens, H = num_kv_heads, D = head_dim):
//
//   [data]   T*H*D elements, head-major [h][t][d]: element i = (h*T + t)*D + d,
//            so one head's rows of a page are contiguous (attention walks a
//            page one KV head at a time; CPU prefetchers and GPU loads want
//            that run contiguous).
//            f32: 4 bytes, f16/bf16: 2 bytes, fp8/int8: 1 byte, int4: 2 per
//            byte (element i in the low nibble when i is even), int2: 4 per
//            byte (element i at bits 2*(i%4)). Rounded up to 16 bytes.
//   [params] only for the scaled formats (fp8, int8, int4, int2): pairs of f16
//            (scale, zero), 4 bytes per pair.
//              keys:   one pair per (h, d), over the page's tokens    [H][D]
//              values: one pair per (t, h, group of kValueGroup channels)
//                                                                    [H][T][D/G]
//            int:  x ~= code * scale + zero,    code in [0, 2^bits - 1]
//            fp8:  x ~= fp8(code) * scale,      zero is stored as 0
//   [pad]    up to a multiple of kPageAlignment (256) bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/numeric.h"
#include "kernels/page_format.h"

namespace polykv::kernels {

// Channels per value quantization group (G). head_dim must be a multiple of it
// for value pages in a scaled format.
inline constexpr int kValueGroup = 32;

POLYKV_HD constexpr bool IsValidFormatValue(PageFormat f) {
  return uint8_t(f) >= 1 && uint8_t(f) <= 7;
}

// Scaled formats carry (scale, zero) params in the page.
POLYKV_HD constexpr bool IsScaledFormat(PageFormat f) {
  return f == PageFormat::kFP8E4M3 || f == PageFormat::kInt8 || f == PageFormat::kInt4 ||
         f == PageFormat::kInt2;
}

POLYKV_HD constexpr bool IsIntFormat(PageFormat f) {
  return f == PageFormat::kInt8 || f == PageFormat::kInt4 || f == PageFormat::kInt2;
}

POLYKV_HD constexpr int BitsOf(PageFormat f) {
  switch (f) {
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

// Largest integer code of an int format (2^bits - 1).
POLYKV_HD constexpr int QMax(PageFormat f) { return (1 << BitsOf(f)) - 1; }

// Plain-data mirror of PageShape with the layout arithmetic (usable on device).
struct PageGeom {
  int block_tokens;
  int num_kv_heads;
  int head_dim;

  POLYKV_HD size_t Elems() const { return size_t(block_tokens) * num_kv_heads * head_dim; }
  // Index of element (t, h, d) inside a page.
  POLYKV_HD size_t ElemIndex(int t, int h, int d) const {
    return (size_t(h) * block_tokens + t) * head_dim + d;
  }
  // Index of element (t, h, d) in a dense token-major [T][H][D] buffer (the
  // layout of the rows handed to and returned by quantize/dequantize).
  POLYKV_HD size_t DenseIndex(int t, int h, int d) const {
    return (size_t(t) * num_kv_heads + h) * head_dim + d;
  }
  POLYKV_HD size_t DataBytes(PageFormat f) const {
    const size_t bytes = (Elems() * size_t(BitsOf(f)) + 7) / 8;
    return (bytes + 15) / 16 * 16;
  }
  POLYKV_HD size_t NumParams(PageFormat f, KvKind kind) const {
    if (!IsScaledFormat(f)) return 0;
    if (kind == KvKind::kKey) return size_t(num_kv_heads) * head_dim;
    return size_t(block_tokens) * num_kv_heads * (head_dim / kValueGroup);
  }
  // Index of the (scale, zero) pair governing element (t, h, d).
  POLYKV_HD size_t ParamIndex(KvKind kind, int t, int h, int d) const {
    if (kind == KvKind::kKey) return size_t(h) * head_dim + d;
    return (size_t(h) * block_tokens + t) * (head_dim / kValueGroup) + d / kValueGroup;
  }
  POLYKV_HD size_t PageBytes(PageFormat f, KvKind kind) const {
    const size_t bytes = DataBytes(f) + NumParams(f, kind) * 4;
    return (bytes + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
  }
  // Whether this shape can be stored in `f` as `kind`.
  POLYKV_HD bool Supports(PageFormat f, KvKind kind) const {
    if (block_tokens <= 0 || num_kv_heads <= 0 || head_dim <= 0) return false;
    if (!IsValidFormatValue(f)) return false;
    if (BitsOf(f) < 8 && head_dim % 8 != 0) return false;  // rows start on byte boundaries
    if (IsScaledFormat(f) && kind == KvKind::kValue && head_dim % kValueGroup != 0) return false;
    return true;
  }
};

POLYKV_HD PageGeom GeomOf(const PageShape& s) {
  return PageGeom{s.block_tokens, s.num_kv_heads, s.head_dim};
}

// One row of a block table: where the K and V pages of `block_tokens`
// consecutive slots live and in which formats. K and V formats are independent.
struct BlockEntry {
  // Byte offsets from the table's `base`, or absolute addresses when base is
  // null. Each page starts kPageAlignment-aligned.
  uint64_t k_offset = 0;
  uint64_t v_offset = 0;
  PageFormat k_format = PageFormat::kF16;
  PageFormat v_format = PageFormat::kF16;
  uint8_t reserved[6] = {};
};
static_assert(sizeof(BlockEntry) == 24, "BlockEntry is shared with device code");

// A read-only view of one sequence's K and V pages for one layer.
// Slot s (0 <= s < num_tokens) is row s % block_tokens of block s / block_tokens.
// On the CUDA backend `base` and `blocks` are device pointers.
struct PagedKvView {
  PageShape shape;
  const uint8_t* base = nullptr;
  const BlockEntry* blocks = nullptr;  // [num_blocks]
  int num_blocks = 0;                  // == ceil(num_tokens / block_tokens)
  int num_tokens = 0;
};

// A writable view (destination of compaction). Same conventions as PagedKvView.
struct PagedKvMut {
  PageShape shape;
  uint8_t* base = nullptr;
  const BlockEntry* blocks = nullptr;  // [num_blocks]
  int num_blocks = 0;
  int num_tokens = 0;
};

POLYKV_HD const uint8_t* PagePtr(const uint8_t* base, uint64_t offset) {
  return base ? base + offset : reinterpret_cast<const uint8_t*>(uintptr_t(offset));
}
POLYKV_HD uint8_t* PagePtr(uint8_t* base, uint64_t offset) {
  return base ? base + offset : reinterpret_cast<uint8_t*>(uintptr_t(offset));
}

}  // namespace polykv::kernels
