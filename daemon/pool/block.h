// Block: the unit the pool hands out — the K and V page of every layer for
// block_tokens tokens of one session — and its shape.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/pool/types.h"
#include "kernels/page_format.h"

namespace polykv::daemon {

// What one block is made of. A session's blocks start in its fill shape; a
// compaction may store cold blocks in coarser formats (requantization), and
// a policy with budgets that differ by layer leaves a layer's oldest blocks
// without its pages (docs/compaction.md, "Budgets that differ by layer").
struct BlockShape {
  uint32_t layers = 0;            // layers with pages in the block
  uint32_t key_page_bytes = 0;    // size class
  uint32_t value_page_bytes = 0;  // size class
  PageFormat key_format = PageFormat::kF16;
  PageFormat value_format = PageFormat::kF16;
  // [model layers] which layers have pages, when not all do (then `layers`
  // counts the true ones); empty: layers 0 .. layers - 1 all do.
  std::vector<bool> present;
  uint64_t bytes() const { return uint64_t(layers) * (key_page_bytes + value_page_bytes); }
  uint32_t page_bytes(size_t i) const { return i % 2 ? value_page_bytes : key_page_bytes; }
  // Entries of Block::pages (2 per model layer) and whether layer l has pages.
  size_t num_entries() const { return 2 * (present.empty() ? layers : present.size()); }
  bool has_layer(size_t l) const { return present.empty() ? l < layers : present[l]; }
  bool operator==(const BlockShape&) const = default;
};

// The shape of a block of `layers` layers in formats kf/vf for `page`-shaped
// pages (size classes from PageBytes). INVALID_ARGUMENT when a format cannot
// hold such pages (PageBytes is 0: e.g. quantized values need head_dim
// divisible by the value group) or a page would exceed `max_page_bytes`.
absl::StatusOr<BlockShape> MakeBlockShape(uint32_t layers, const kernels::PageShape& page,
                                          PageFormat kf, PageFormat vf, uint64_t max_page_bytes);

// One block's pages, in its shape's formats: pages[2 * layer] is K,
// pages[2 * layer + 1] is V; kNoPage for a layer the block has none of.
struct Block {
  BlockShape shape;
  std::vector<PageId> pages;
  // A shared prefix block's entry (prefix_index.h): the pages are the
  // index's, held by every table that holds the block; 0: the table's own.
  PrefixId prefix = 0;
  bool empty() const { return pages.empty(); }
  uint64_t bytes() const { return shape.bytes(); }
};

}  // namespace polykv::daemon
