// The input of every policy: a read-only view of one session's cached slots,
// per layer, with the metadata and score streams the worker reports.
//
// A "slot" is one entry of one layer's KV cache: a token, or several tokens a
// previous plan merged into one (multiplicity > 1). Layers are independent:
// after compaction, layer 3 may hold slots that layer 7 evicted, so each layer
// has its own slot list. Layer-independent metadata (position, turn, role,
// structural tag) lives once per token in SessionView::tokens and slots point
// at it.
//
// Nothing here owns device memory or does I/O. Plain structs; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/page_format.h"
#include "policies/score_stream.h"

namespace polykv::policies {

// Who produced a token. Wire-stable values (they appear in traces).
enum class Role : uint8_t {
  kSystem = 0,
  kUser = 1,
  kAssistant = 2,
  kToolCall = 3,
  kToolOutput = 4,
  kError = 5,
};
inline constexpr int kNumRoles = 6;

// Structural block kinds (CodeComp). kNone = untagged. Wire-stable values.
enum class BlockKind : uint8_t {
  kNone = 0,
  kText = 1,        // prose: system prompt, user request, assistant reasoning
  kImport = 2,      // import / #include / use / package lines
  kSignature = 3,   // function or method signature (incl. decorators)
  kClass = 4,       // class / struct / interface / enum / impl declaration lines
  kBody = 5,        // statements inside a function body
  kComment = 6,     // comments and docstrings
  kStatement = 7,   // code outside any function (module level, class fields)
  kToolCall = 8,    // agent markup: a tool call
  kToolOutput = 9,  // agent markup: a tool's output
  kError = 10,      // error output: tracebacks, compiler errors, failing tests
};
inline constexpr int kNumBlockKinds = 11;

std::string_view RoleName(Role role);
std::optional<Role> ParseRole(std::string_view name);
std::string_view BlockKindName(BlockKind kind);
std::optional<BlockKind> ParseBlockKind(std::string_view name);

// The structural tag of one token (from StructureTagger or the worker).
struct StructTag {
  BlockKind kind = BlockKind::kNone;
  // Tokens with the same block_id belong to one block (one function body, one
  // comment, one tool output...). Merges never cross blocks. 0 = no block.
  uint32_t block_id = 0;
  uint16_t depth = 0;     // nesting depth (braces / indentation)
  bool boundary = false;  // first or last token of its block
};

// What a worker reports of one slot (libpolykv_client's SlotMeta) and the
// daemon keeps for it: the token's metadata except its position.
struct SlotMeta {
  int32_t turn = 0;  // 0-based turn index; a turn = one message
  Role role = Role::kUser;
  StructTag tag;
  bool pinned = false;  // the daemon or client pinned it: never evicted
};

// Layer-independent metadata of one token, index = token id in the session.
struct TokenMeta : SlotMeta {
  int64_t position = 0;  // logical position (RoPE position) in the session
};

// One entry of one layer's cache.
struct Slot {
  uint32_t token = 0;  // index into SessionView::tokens (a merged slot: its representative)
  uint32_t count = 1;  // multiplicity: tokens folded into this slot (>= 1)
  // The slot streams (score_stream.h says what each measures), every value
  // resolved: an unreported one reads as its stream's WhenAbsent says
  // (policies::Resolved); a view built by hand has 0 for what it leaves out.
  SlotScores score = SlotScores::Zero();
  kernels::PageFormat k_format = kernels::PageFormat::kBF16;
  kernels::PageFormat v_format = kernels::PageFormat::kBF16;
};

struct LayerView {
  // [num_slots] ordered by TokenMeta::position ascending (the cache order).
  std::vector<Slot> slots;
  // [num_slots * SessionView::key_dim] row-major key summaries (e.g. the key
  // averaged over KV heads, projected to key_dim). Empty when not reported;
  // merging then degrades to eviction.
  std::vector<float> keys;
  // The per-layer streams (ScoreStream::kEntropy: the layer's mean attention
  // entropy, for entropy-calibrated layer budgets); NaN when unknown.
  LayerScores score;
};

struct SessionView {
  std::vector<TokenMeta> tokens;  // [num_tokens]
  std::vector<LayerView> layers;  // [num_layers]
  int key_dim = 0;                // width of LayerView::keys rows; 0 = no keys
  kernels::PageShape shape;       // of one page (block_tokens, kv heads, head dim)
  int32_t current_turn = 0;       // the turn being decoded now

  int num_layers() const { return static_cast<int>(layers.size()); }
  const TokenMeta& meta(int layer, size_t slot) const {
    return tokens[layers[layer].slots[slot].token];
  }
  // REQUIRES: key_dim > 0 and the layer reports keys.
  const float* key(int layer, size_t slot) const {
    return layers[layer].keys.data() + slot * static_cast<size_t>(key_dim);
  }
};

// Checks the view's own invariants (slot order, token indices, key sizes,
// counts >= 1). Policies call it first; bad input is InvalidArgument.
absl::Status ValidateView(const SessionView& view);
// ValidateView's checks of one layer, plus key_dim >= 0: what a caller needs
// to validate each layer just before it reads it, while its slots are still
// in cache. ValidateView == key_dim check + ValidateLayer of every layer.
absl::Status ValidateLayer(const SessionView& view, int layer);

// Bytes one token of one layer costs in the given K and V formats: the page
// size of each format divided by block_tokens (pages are the allocation unit,
// so this is exact for full pages). Returns 0 for an invalid shape.
double BytesPerToken(const kernels::PageShape& shape, kernels::PageFormat k_format,
                     kernels::PageFormat v_format);

// A requantization step the caller asks of one decision (the daemon's
// pressure ladder): it replaces the policy's cold.* parameters and, where the
// policy has a window component, its window.size. Typed data, so a step needs
// no policy text of its own (each distinct text was a policy kept for the
// daemon's lifetime).
struct ColdStep {
  kernels::PageFormat format = kernels::PageFormat::kInt4;
  bool keys = false;
  bool values = true;
  double fraction = 0;  // of output slots, in whole blocks (cold.fraction)
  int64_t window = -1;  // recent slots kept in the fill format; < 0: the policy's own
  bool operator==(const ColdStep&) const = default;
};

// Budget for one decision. Either explicit per-layer limits, or one total the
// policy splits across layers with its layer allocator.
struct Budget {
  enum class Unit : uint8_t { kTokens, kBytes };
  Unit unit = Unit::kTokens;
  // [num_layers] when set: per-layer limits, used as given.
  std::vector<int64_t> per_layer;
  // Used when per_layer is empty: the sum over layers.
  int64_t total = 0;
  // Set: this decision's cold step instead of the policy's (see ColdStep).
  std::optional<ColdStep> cold;

  static Budget TokensPerLayer(int num_layers, int64_t tokens) {
    return Budget{Unit::kTokens, std::vector<int64_t>(num_layers, tokens), 0};
  }
  static Budget TotalTokens(int64_t tokens) { return Budget{Unit::kTokens, {}, tokens}; }
  static Budget BytesPerLayer(int num_layers, int64_t bytes) {
    return Budget{Unit::kBytes, std::vector<int64_t>(num_layers, bytes), 0};
  }
};

}  // namespace polykv::policies
