// LayerHole: which slots of a session's table a layer holds once its
// layers keep budgets of their own (a select=layer policy compacted them
// apart). Layers keep different counts, yet append each new token at the
// same slot, so a layer that keeps fewer holds none of a run of whole blocks:
// its hole. The hole follows the leading blocks every layer kept in place (a
// shared prefix, pinned in every layer, stays in its shared blocks: without
// them start is 0) and ends where the layer's newer slots begin.
//
// Thread-safety: a value type.
#pragma once

#include <cstdint>

namespace polykv::daemon {

struct LayerHole {
  uint64_t start = 0;   // first slot not held (a multiple of block_tokens)
  uint64_t length = 0;  // slots not held (a multiple of block_tokens); 0: none

  uint64_t end() const { return start + length; }
  bool empty() const { return length == 0; }
  bool holds(uint64_t slot) const { return slot < start || slot >= end(); }
  // The table slot of the layer's `local`-th held slot.
  uint64_t TableSlot(uint64_t local) const { return local < start ? local : local + length; }
  // The layer's index of a held table slot.
  uint64_t LocalSlot(uint64_t slot) const { return slot < start ? slot : slot - length; }
  friend bool operator==(const LayerHole&, const LayerHole&) = default;
};

}  // namespace polykv::daemon
