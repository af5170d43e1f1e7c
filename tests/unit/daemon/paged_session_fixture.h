// A KvPool with a fake clock and real memfd arenas mapped into the test,
// which plays the worker: it opens sessions, writes a recognisable pattern
// per position into their pages, commits, syncs, and checks after every new
// epoch that each slot holds the pattern of the position the daemon says.
// For the pool's tests of compaction and of shared prefixes.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/pool/kv_pool.h"
#include "kernels/ops.h"
#include "tests/unit/daemon/mapped_arenas.h"

namespace polykv::daemon {

constexpr uint64_t kMiB = 1ull << 20;
constexpr int kLayers = 2, kHeads = 2, kDim = 32, kBlock = 16;

// Recognisable content of token `pos` (exact in f32 for pos < 2^12).
inline float Pattern(int64_t pos, int layer, bool value, int h, int d) {
  const float x = float(pos * 4096 + layer * 256 + h * 64 + d);
  return value ? -x : x;
}

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000000);
};

using policies::ScoreStream;

// r's values of `stream` (per layer when per_layer), added empty if absent.
inline std::vector<float>& Values(ReportSlotsRequest& r, ScoreStream stream, bool per_layer = false) {
  for (auto& v : r.scores) {
    if (v.stream == stream && v.per_layer == per_layer) return v.values;
  }
  r.scores.push_back({stream, per_layer, {}});
  return r.scores.back().values;
}
inline void Erase(ReportSlotsRequest& r, ScoreStream stream) {
  std::erase_if(r.scores, [&](const auto& v) { return v.stream == stream; });
}

class PagedSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = MakePool(16 * kMiB);
    arenas_.Reset(pool_.get());
  }

  // A test's own options (offload tiers, ...), over the fixture's.
  virtual void Configure(KvPoolOptions&) {}

  std::unique_ptr<KvPool> MakePool(uint64_t bytes, uint64_t low_watermark = 0) {
    KvPoolOptions o;
    o.pool_bytes = bytes;
    o.arena_bytes = 4 * kMiB;
    o.superblock_bytes = 256 * 1024;
    o.default_lease_ms = 1000;
    o.low_watermark_bytes = low_watermark;
    o.arena_factory = CreateHostShmArena;
    o.clock = [this] { return clock_.now; };
    Configure(o);
    auto p = KvPool::Create(o);
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }

  struct Sess {
    uint64_t id = 0;
    std::string token;
    uint64_t epoch = 0;
    std::vector<BlockDesc> blocks;
    int64_t next_pos = 0;   // logical position of the next token
    uint64_t committed = 0;
    std::vector<int64_t> positions;  // [committed]
    std::vector<uint32_t> counts;    // [committed] tokens each slot stands for
    policies::WantedStreams wants;  // OpenResult: what the policy reads
    // [kLayers x committed] once the layers hold their own slots; else empty.
    std::vector<int64_t> layer_positions;
    bool same_slots = false;  // of the last Sync that changed the tables
    int64_t position(int layer, size_t slot) const {
      return layer_positions.empty() ? positions[slot] : layer_positions[layer * committed + slot];
    }
  };

  // Ladder step "compaction_failed" so far.
  uint64_t CompactionFailures() {
    PoolSummary st = pool_->Stats();
    std::map<std::string, uint64_t> ladder(st.ladder_steps.begin(), st.ladder_steps.end());
    return ladder["compaction_failed"];
  }

  void SetQos(const std::string& agent, const std::string& policy, uint64_t budget,
              Priority prio = Priority::kNormal, uint64_t guaranteed = 0,
              std::optional<kernels::PageFormat> value_floor = std::nullopt) {
    QosRecord q;
    q.agent_id = agent;
    q.policy = policy;
    q.budget_tokens = budget;
    q.priority = prio;
    q.guaranteed_bytes = guaranteed;
    q.value_floor = value_floor;
    auto r = pool_->SetQos(q);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  // layers > kLayers: the helpers write and check layers 0 .. kLayers - 1
  // only (the others' pages stay zero).
  Sess Open(const std::string& agent, uint32_t layers = kLayers,
            const std::string& tenant = "t1", const std::string& model = "tiny") {
    OpenRequest r;
    r.agent_id = agent;
    r.tenant = tenant;
    r.profile = {layers, kHeads, kDim, DType::kF32, model};
    r.block_tokens = kBlock;
    r.peer = peer_;
    auto o = pool_->Open(r);
    EXPECT_TRUE(o.ok()) << o.status();
    Map(o->session_id, o->token, o->arenas);
    Sess out{o->session_id, o->token};
    out.wants = o->wants;
    return out;
  }

  void Map(uint64_t id, const std::string& token, const std::vector<ArenaExport>& arenas) {
    arenas_.Map(id, token, peer_, arenas);
  }

  // The K (v = 0) or V page of layer l in b; nullptr where the layer holds
  // none of b's slots (its budget is its own).
  static const PageDesc* PageOf(const BlockDesc& b, int l, int v) {
    for (const PageDesc& p : b.pages) {
      if (p.layer == uint32_t(l) && p.is_value == (v == 1)) return &p;
    }
    return nullptr;
  }

  uint8_t* Addr(const PageDesc& p) { return arenas_.Addr(p); }

  // Appends n tokens like a worker step: reserve, write K/V, commit.
  absl::Status Append(Sess& s, int n) {
    const uint64_t need = s.committed + n;
    const uint64_t have = s.blocks.size() * kBlock;
    if (need > have) {
      auto r = pool_->Reserve(s.id, s.token, peer_, need - have);
      if (!r.ok()) return r.status();
      Map(s.id, s.token, r->new_arenas);
      for (auto& b : r->blocks) s.blocks.push_back(b);
    }
    const kernels::PageShape shape{kBlock, kHeads, kDim};
    std::vector<float> row(kHeads * kDim);
    for (int i = 0; i < n; ++i) {
      const uint64_t slot = s.committed + i;
      const int64_t pos = s.next_pos + i;
      const BlockDesc& b = s.blocks[slot / kBlock];
      for (int l = 0; l < kLayers; ++l) {
        for (int v = 0; v < 2; ++v) {
          for (int h = 0; h < kHeads; ++h) {
            for (int d = 0; d < kDim; ++d) row[h * kDim + d] = pattern_(pos, l, v, h, d);
          }
          const PageDesc* page = PageOf(b, l, v);
          if (page == nullptr) return absl::InternalError("appending to a block a layer lacks");
          auto st = kernels::WritePageRows(shape, page->format, row.data(),
                                           static_cast<int>(slot % kBlock), 1, Addr(*page));
          if (!st.ok()) return st;
        }
      }
      s.positions.push_back(pos);
    }
    s.next_pos += n;
    auto c = pool_->Commit(s.id, s.token, peer_, need);
    if (!c.ok()) return c.status();
    s.committed = need;
    return absl::OkStatus();
  }

  // Step boundary: Sync; on a new epoch adopt it and check every slot holds
  // the pattern of the position the daemon says it holds. Acks when `ack`.
  absl::StatusOr<bool> Sync(Sess& s, bool ack = true) {
    auto r = pool_->Sync(s.id, s.token, peer_, s.epoch);
    if (!r.ok()) return r.status();
    Map(s.id, s.token, r->new_arenas);
    if (!r->changed) return false;
    s.epoch = r->epoch;
    s.blocks = r->blocks;
    s.committed = r->committed_tokens;
    s.positions = r->slot_positions;
    s.counts = r->slot_counts;
    s.layer_positions = r->layer_slot_positions;
    s.same_slots = r->same_slots;
    if (!s.layer_positions.empty()) {
      EXPECT_EQ(s.layer_positions.size(), kLayers * r->committed_tokens);
      EXPECT_TRUE(std::equal(s.positions.begin(), s.positions.end(), s.layer_positions.begin()));
    }
    EXPECT_EQ(r->slot_positions.size(), r->committed_tokens);
    EXPECT_EQ(r->slot_counts.size(), r->committed_tokens);
    VerifyContent(s);
    if (ack) {
      if (auto a = pool_->Ack(s.id, s.token, peer_, s.epoch); !a.ok()) return a;
    }
    return true;
  }

  // Every slot holds its position's pattern as its page's format encodes it
  // (exactly the pattern in f32; in a requantized page, the pattern rows of
  // the block's positions encoded by QuantizePage and decoded).
  void VerifyContent(const Sess& s) {
    const kernels::PageShape shape{kBlock, kHeads, kDim};
    const size_t row = kHeads * kDim;
    std::vector<float> rows(kBlock * row), want(kBlock * row), pattern(kBlock * row);
    std::vector<uint8_t> scratch;
    const kernels::Exec exec;
    for (size_t b = 0; b * kBlock < s.committed; ++b) {
      const int n = static_cast<int>(std::min<uint64_t>(kBlock, s.committed - b * kBlock));
      for (int l = 0; l < kLayers; ++l) {
        for (int v = 0; v < 2; ++v) {
          const PageDesc* held = PageOf(s.blocks[b], l, v);
          if (held == nullptr) {  // the layer starts later: it holds none of these slots
            for (int t = 0; t < n; ++t) {
              ASSERT_EQ(s.position(l, b * kBlock + t), -1) << "layer " << l << " block " << b;
            }
            continue;
          }
          const PageDesc& page = *held;
          const auto kind = v ? kernels::KvKind::kValue : kernels::KvKind::kKey;
          ASSERT_TRUE(
              kernels::DequantizePage(exec, shape, kind, page.format, Addr(page), n, rows.data())
                  .ok());
          for (int t = 0; t < n; ++t) {
            const int64_t pos = s.position(l, b * kBlock + t);
            for (int h = 0; h < kHeads; ++h) {
              for (int d = 0; d < kDim; ++d) pattern[t * row + h * kDim + d] = pattern_(pos, l, v, h, d);
            }
          }
          scratch.assign(kernels::PageBytes(page.format, kind, shape), 0);
          ASSERT_TRUE(kernels::QuantizePage(exec, shape, kind, page.format, pattern.data(),
                                            kernels::SourceType::kF32, n, scratch.data())
                          .ok());
          ASSERT_TRUE(
              kernels::DequantizePage(exec, shape, kind, page.format, scratch.data(), n, want.data())
                  .ok());
          for (size_t i = 0; i < size_t(n) * row; ++i) {
            if (s.counts.size() > b * kBlock + i / row && s.counts[b * kBlock + i / row] > 1) {
              continue;  // a merged slot: the weighted mean of its members
            }
            ASSERT_EQ(rows[i], want[i]) << "slot " << b * kBlock + i / row << " position "
                                        << s.position(l, b * kBlock + i / row) << " layer " << l;
          }
        }
      }
    }
  }

  void Check() {
    auto s = pool_->CheckInvariants();
    ASSERT_TRUE(s.ok()) << s;
  }

  FakeClock clock_;
  PeerCreds peer_{1234, 1000, 1000};
  std::function<float(int64_t, int, bool, int, int)> pattern_ = Pattern;
  std::unique_ptr<KvPool> pool_;
  MappedArenas arenas_{nullptr};  // of pool_ (SetUp)
};

}  // namespace polykv::daemon
