// Layer budget allocators: split one token budget across layers.
//
// Any policy takes one through its `layers` parameter; they apply when the
// Budget is a total (explicit per-layer budgets are hard caps, used as given).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

namespace polykv::policies {

enum class LayerAllocator : uint8_t {
  kUniform = 0,  // equal shares
  kPyramid = 1,  // linear: low layers get (1 + skew) x, top layers (1 - skew) x
                 // the mean (PyramidKV's observation that low layers attend broadly)
  kEntropy = 2,  // IntentKV: layers ranked by attention entropy; the most
                 // diffuse third gets 0.6 x, the middle 0.8 x, the most focused
                 // 1.2 x base. Unknown entropies fall back to layer depth
                 // (low/mid/high layers = 0.6/0.8/1.2), as in the seed.
  kImportance = 3,  // one threshold over every layer's slot importance (KVzip's
                    // per-layer scores): a layer keeps its slots above it, so
                    // layers whose tokens matter more keep more
                    // (ImportanceLayerBudgets); without scores, uniform.
};

std::optional<LayerAllocator> ParseLayerAllocator(std::string_view name);
std::string_view LayerAllocatorName(LayerAllocator a);

// Splits `total` tokens over layers.
//   layer_sizes: [num_layers] slots each layer holds now; no layer gets more
//                than it holds, the surplus goes to the others in proportion
//                to their weights (water-filling).
//   entropy:     [num_layers] mean attention entropy per layer, < 0 or NaN = unknown.
// Returns [num_layers] budgets, sum <= total, deterministic (largest-remainder
// rounding, ties to the lower layer). REQUIRES: total >= 0.
std::vector<int64_t> AllocateLayerBudgets(LayerAllocator allocator, int64_t total,
                                          absl::Span<const int64_t> layer_sizes,
                                          absl::Span<const float> entropy, double skew = 0.5);

// kImportance's budgets: the `total` most important slots over all layers
// (scores[l] holds layer l's, one per slot; NaN ranks lowest), counted per
// layer. Slots tied at the threshold fill the rest in proportion to each
// layer's tied count, so scores that tell nothing apart split evenly.
std::vector<int64_t> ImportanceLayerBudgets(int64_t total,
                                            absl::Span<const std::vector<float>> scores);

// The per-layer multipliers before normalisation (exposed for tests and docs).
std::vector<double> LayerWeights(LayerAllocator allocator, absl::Span<const float> entropy,
                                 double skew);

}  // namespace polykv::policies
