// Compaction executor: turns a session's slot records and a policy's Plan into
// gather/merge groups, and runs the kernels' CompactSlots over the session's
// pages into NEW pages (ARCHITECTURE.md, consistency rule 2). Pure functions
// over plain data; the pool (daemon/pool/kv_pool.cc) owns locking, page
// allocation and epochs.
//
// Decisions are layer-uniform unless the policy selects per layer: the daemon
// builds a ONE-layer SessionView whose scores are the worker's attention mass
// summed over layers (what ReportSlots carries), and applies that layer's
// plan to every layer. A policy with select=layer instead gets one view
// layer per model layer, built from that layer's own slot records (each with
// its own importance), and each layer keeps its own slots, as many as its
// budget says: one block table still describes the session, a layer that
// keeps fewer holding none of its oldest blocks (compactor.h; the slot
// indices of LayerTables and the groups are then the layer's own, counted
// from its first block).
//
// Thread-safety: stateless; thread-safe.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/page_format.h"
#include "kernels/page_layout.h"
#include "policies/lowering.h"
#include "policies/plan.h"
#include "policies/session_view.h"
#include "policies/slot_record.h"

namespace polykv::daemon {

// What the daemon knows about one committed slot of a session.
using policies::SlotRecord;

// The K/V formats of a session's blocks. A requantized block is coarser than
// the fill formats (what the worker appends in); blocks past k/v (all of
// them when those are empty) are in the fill formats.
struct TableFormats {
  kernels::PageFormat fill_k = kernels::PageFormat::kF16;
  kernels::PageFormat fill_v = kernels::PageFormat::kF16;
  std::vector<kernels::PageFormat> k, v;  // [block]
  kernels::PageFormat key(size_t block) const { return block < k.size() ? k[block] : fill_k; }
  kernels::PageFormat value(size_t block) const { return block < v.size() ? v[block] : fill_v; }
};

// One-layer view of `slots` (see file comment); each slot has its block's
// formats. shape: the session's page shape.
policies::SessionView BuildView(const std::vector<SlotRecord>& slots,
                                const kernels::PageShape& shape, const TableFormats& formats,
                                int32_t current_turn);
// A view with one layer per entry of `layers` (each a layer's records):
// view layer l is BuildView's layer of layers[l], its tokens the records'
// own (so view.tokens holds every layer's, in turn).
policies::SessionView BuildLayerView(const std::vector<std::span<const SlotRecord>>& layers,
                                     const kernels::PageShape& shape, const TableFormats& formats,
                                     int32_t current_turn);

// Keys for the daemon's one-layer view (merging clusters slots by key
// similarity). The layers whose keys summarise a slot: up to 4, evenly
// spaced (bounds the decode cost and the view's size).
std::vector<uint32_t> KeySummaryLayers(uint32_t num_layers);

// Reads the keys of the first `num_slots` slots from their pages (through the
// kernels' decoder, so every page format reads the same way): per layer of
// `tables` ([layer][source block] entries with absolute addresses, in the
// memory of GPU `device`, or of the host for -1), the slot's key averaged
// over KV heads and scaled to unit length, concatenated. So the cosine of two
// summaries is the mean of their per-layer cosines.
// keys: [num_slots * tables.size() * head_dim].
absl::Status ReadKeySummaries(const kernels::PageShape& shape, int num_slots,
                              const std::vector<std::vector<kernels::BlockEntry>>& tables,
                              int device, std::vector<float>& keys);

// A layer's plan lowered (policies::LoweredLayer: the kernels' CSR groups,
// each output slot's source and count, the output blocks' formats) with the
// records the output slots get: the one shape of a compaction's per-slot
// data from the plan to the kernels' copy.
struct CompactionGroups : policies::LoweredLayer {
  std::vector<SlotRecord> slots;  // [num_out] records of the output slots
  // Plan::log_count_bias: whether the worker's attention weighs a merged
  // slot by its count (merge.bias=1) or as one token.
  bool log_count_bias = true;
};

// The daemon's side of policies::LowerLayer (policies/lowering.h, the one
// lowering the offline replay runs too): its groups, and the output
// slots' records. A merged slot takes its representative's metadata, the
// members' summed count and attention, and is pinned if any member was.
// Requantization is the output blocks' formats (executed by the copy).
// REQUIRES: view == BuildView(slots, ...), and the plan is valid for it.
absl::StatusOr<CompactionGroups> LowerPlan(const policies::SessionView& view,
                                           const std::vector<SlotRecord>& slots,
                                           const policies::Plan& plan);
// The same for layer `layer` of a multi-layer view and plan (BuildLayerView),
// `slots` being that layer's records.
absl::StatusOr<CompactionGroups> LowerPlanLayer(const policies::SessionView& view, int layer,
                                                std::span<const SlotRecord> slots,
                                                const policies::Plan& plan);
// The output records another layer's `slots` get from `groups` (lowered for
// a different layer's records): as LowerPlan's, each output slot takes its
// source's record with the groups' count; a merge group adds up attention
// and observation and takes the most intent and importance. What a
// layer-uniform plan gives the other layers of a session whose layers were
// compacted apart. REQUIRES: groups from LowerPlan(Layer) (sources set).
std::vector<SlotRecord> OutputRecords(const CompactionGroups& groups,
                                      const std::vector<SlotRecord>& slots);

// Pages of one layer: the K/V page addresses of each block it holds
// (absolute addresses in BlockEntry offsets, all in host memory or all in
// device memory; formats set).
struct LayerTables {
  std::vector<kernels::BlockEntry> src;  // [source blocks the layer holds]
  int num_src = 0;                       // slots in them
  std::vector<kernels::BlockEntry> dst;  // [ceil(its groups' num_out / block_tokens)]
};

// Runs CompactSlots for every layer: dst slot j of layer l = group j of
// that layer's src slots, the groups being groups[0] for every layer when
// there is one, else groups[l] ([layers.size()]). A layer with no output
// slots is skipped.
// device >= 0: the pages are that GPU's memory, and the CUDA kernels run
// there (the tables and groups copied to it, the device waited for before
// this returns). REQUIRES: dst pages disjoint from src pages.
absl::Status ExecuteCompaction(const kernels::PageShape& shape,
                               const std::vector<LayerTables>& layers,
                               const std::vector<const CompactionGroups*>& groups,
                               int device = -1);

}  // namespace polykv::daemon
