// An experiment for issue 44, not a product kernel: decode attention over
// int4 or int8 K/V pages whose codes are repacked so that AVX-512 VNNI's vpdpbusd
// reduces 4 codes per lane against an int8 operand -- 4 channels of 16 tokens
// for the scores (q . k), 4 tokens of 16 channels for the values (p . v) --
// instead of converting every code to f32 first. It answers one question
// before the page layout changes: how fast is decode when the page format is
// laid out for integer dot products, and what does quantizing the query
// (per page, int8) and the probabilities (per page and value group, 7 bits)
// add to the format's own error.
//
// The codes and (scale, zero) params are the product's pages', repacked;
// `polykv-bench kernels --only intdecode` times the product's f16, int8 and
// int4 decode beside this on the same data and compares the outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/page_format.h"

namespace polykv::bench {

// int4 or int8 K/V of num_pages pages of kTokens tokens, num_kv_heads heads
// of head_dim channels, in the VNNI layout (see int_decode_proto.cc).
struct IntDecodePages {
  static constexpr int kTokens = 64, kGroup = 32;
  int bits = 4;         // 4 or 8
  int head_dim = 128;   // 128 (4 query heads a KV head) or 64 (7: Qwen2.5-Coder-0.5B)
  int num_pages = 0;
  int num_kv_heads = 0;
  std::vector<uint8_t> kcode;        // [page][head][4 tiles][runs][64 bytes]
  // The (scale, zero) params in f16, as the pages hold them.
  std::vector<uint16_t> kscale, kzero;  // [page][head][head_dim]
  std::vector<uint8_t> vcode;        // [page][head][token groups][8 channel runs][64 bytes]
  std::vector<uint16_t> vscale, vzero;  // [page][head][head_dim / kGroup][kTokens]
};

// From the product's pages in `format` (int4 or int8; kernels::PageShape{64,
// num_kv_heads, head_dim}), page i of the keys at k_pages + i * k_page_bytes,
// the values likewise.
IntDecodePages RepackPages(kernels::PageFormat format, const uint8_t* k_pages,
                           size_t k_page_bytes, const uint8_t* v_pages, size_t v_page_bytes,
                           int num_pages, int num_kv_heads, int head_dim);

// How the value pass weighs each token's codes: its probability times the
// token's value scale, rounded per page, query head and value group to 7 bits
// (one vpdpbusd per 4 tokens), to 14 (two), or kept in f32 (the codes
// converted to f32 and multiplied in: the scores' integer pass alone).
enum class ProbBits { k7, k14, kFloat };
// The query times the page's key scales, rounded per page and query head to
// int8 (7 bits and a sign: one vpdpbusd per 4 channels) or to 14 bits and a
// sign (two).
struct IntDecodeMode {
  int query_bits = 7;  // 7 or 14
  ProbBits probs = ProbBits::k14;
};

// Whether this CPU runs the prototype (AVX-512 F/BW and VNNI).
bool IntDecodeSupported();

// One decode step on one thread: q [num_q_heads][head_dim] -> out
// [num_q_heads][head_dim], softmax scale 1/sqrt(head_dim), query head i on KV
// head i / (num_q_heads / num_kv_heads). REQUIRES: IntDecodeSupported(), and
// head_dim 128 with 4 query heads a KV head or 64 with 7 (else it aborts).
void IntDecode(const IntDecodePages& p, IntDecodeMode mode, int num_q_heads, const float* q,
               float* out);

}  // namespace polykv::bench
