// One cache configuration of the evaluation matrix, written
// "policy@budget/formats[/T<n>][/R<n>]": e.g. "h2o@0.25/K8V4", "full@1/f16",
// "sinks+structural+intent@0.1/K2V2", "full@1/K4V2/T64", "full@1/K4V4/R128".
//
//   policy   a policies/ preset or '+'-joined composite, optionally with
//            parameters in braces (policies::MakePolicyFromText), e.g.
//            "h2o{cold.format=int4,cold.fraction=0.5}@0.25/f16"
//   budget   fraction of the context's tokens each layer keeps on average
//            (0 < budget <= 1); "full" ignores it
//   formats  f32 | f16 | K<k>V<v> with k, v in {8, 4, 2} (int8/int4/int2 pages).
//            A format with int2 keeps the most recent 128 slots in f16
//            (KIVI's residual) unless R<n> says otherwise. In the harness
//            every format keeps the partial last page and new tokens in f16.
//   T<n>     tokens per page (a power of two in 1..256; default 16, the
//            pool's). Key params are per channel per page, so longer pages
//            spend fewer bits on them (docs/formats.md) and keep a longer
//            f16 residual page; omitted from the canonical text when 16.
//   R<n>     the recent window kept in f16 beside quantized pages, in
//            tokens (f16_tail): the harness keeps the latest n context slots
//            in f16; live, the worker attends its newest pages covering at
//            least n tokens from f16 copies (polykv-worker
//            --recent-f16-tokens). Omitted when it is the formats' default.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/page_format.h"

namespace polykv::eval {

inline constexpr int kDefaultBlockTokens = 16;  // Slots per page, as the pool's default.

struct CacheConfig {
  std::string text;     // as written, canonical ("h2o@0.25/K8V4")
  std::string policy;   // "full", "h2o", "sinks+structural+intent", ...
  double budget = 1.0;
  std::string formats;  // "f16", "K8V4", ...
  kernels::PageFormat k_format = kernels::PageFormat::kF16;
  kernels::PageFormat v_format = kernels::PageFormat::kF16;
  kernels::PageFormat append_format = kernels::PageFormat::kF16;
  int f16_tail = 0;     // residual slots kept in append_format
  int block_tokens = kDefaultBlockTokens;
  bool full() const { return policy == "full"; }
};

// InvalidArgument naming the bad part.
absl::StatusOr<CacheConfig> ParseCacheConfig(std::string_view text);

// The reference every other configuration is compared with.
inline constexpr std::string_view kReferenceConfig = "full@1/f16";

}  // namespace polykv::eval
