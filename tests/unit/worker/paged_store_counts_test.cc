// PagedKvStore over a table with merged slots (PagedTable::slot_counts, the
// daemon's Sync slot_counts): attention must weigh a slot that stands for c
// tokens like c copies of it (log(count) added to its score), an all-ones
// table must leave the unmerged path bit for bit as it was, and bad counts
// must be refused with a clear error. No model: K, V and queries are random.
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/random_steps.h"

namespace polykv::worker {
namespace {

using testing::kBlock;
using testing::kHeadDim;
using testing::kLayers;
using testing::kQHeads;
using testing::kRow;
using testing::Pick;
using testing::RandomQ;
using testing::RandomRows;
using testing::RelL2;
using testing::Rows;
using testing::Shape;
using testing::Step;

struct Store {
  testing::RepublishingSource* src = nullptr;  // owned by store
  std::unique_ptr<PagedKvStore> store;
};

// Heap pages (f32) republished with the slot counts a merge would publish;
// the store asks for the prefill attention mass too (the mass path).
Store NewStore() {
  Store s;
  s.src = new testing::RepublishingSource(testing::HeapSource(), {{ScoreStream::kAttention}});
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.sync_every_steps = 1;  // Every step boundary adopts a published table.
  o.exec.num_threads = 2;
  auto store = PagedKvStore::Create(o, std::unique_ptr<PageSource>(s.src));
  EXPECT_TRUE(store.ok()) << store.status();
  s.store = std::move(*store);
  return s;
}

uint32_t Seed() {
  const uint32_t seed = 20260101;
  std::printf("[seed] %u\n", seed);
  return seed;
}

constexpr int kContext = 20;  // slots before the merge: one full block, one partial

// Slot 5 stands for 3 tokens, slot 17 (the partial block) for 2.
std::vector<uint32_t> MergedCounts() {
  std::vector<uint32_t> c(kContext, 1);
  c[5] = 3;
  c[17] = 2;
  return c;
}

TEST(PagedKvStoreCountsTest, AMergedSlotAttendsLikeCountCopiesOfIt) {
  std::mt19937 rng(Seed());
  const Rows context = RandomRows(kContext, rng);
  const Rows decode = RandomRows(1, rng), chunk = RandomRows(3, rng);
  const std::vector<float> q_context = RandomQ(kContext, rng);
  const std::vector<float> q_decode = RandomQ(1, rng), q_chunk = RandomQ(3, rng);

  // The daemon's view: 20 slots, slots 5 and 17 merged (counts 3 and 2).
  Store merged = NewStore();
  Step(merged.store.get(), context, q_context, 0);
  merged.src->Publish(MergedCounts());
  const std::vector<float> merged_decode = Step(merged.store.get(), decode, q_decode, 100);
  ASSERT_EQ(merged.store->epoch(), 1u);  // the table was adopted at that step
  const std::vector<float> merged_chunk = Step(merged.store.get(), chunk, q_chunk, 101);
  const std::vector<float> merged_mass = merged.store->pending_attention_mass();

  // What the merged slots stand for: the same 20 slots plus two more copies
  // of slot 5 and one more of slot 17 (slots 20, 21, 22), no counts.
  std::vector<int> with_copies;
  for (int s = 0; s < kContext; ++s) with_copies.push_back(s);
  with_copies.insert(with_copies.end(), {5, 5, 17});
  Store copies = NewStore();
  Step(copies.store.get(), Pick(context, with_copies), RandomQ(23, rng), 0);
  const std::vector<float> mass_before = copies.store->pending_attention_mass();
  const std::vector<float> copies_decode = Step(copies.store.get(), decode, q_decode, 100);
  const std::vector<float> copies_chunk = Step(copies.store.get(), chunk, q_chunk, 101);
  std::vector<float> copies_mass = copies.store->pending_attention_mass();
  for (size_t s = 0; s < mass_before.size(); ++s) copies_mass[s] -= mass_before[s];

  // The same table without counts: a merged slot weighs as one token.
  Store plain = NewStore();
  Step(plain.store.get(), context, q_context, 0);
  plain.src->Publish({});
  const std::vector<float> plain_decode = Step(plain.store.get(), decode, q_decode, 100);
  const std::vector<float> plain_chunk = Step(plain.store.get(), chunk, q_chunk, 101);

  EXPECT_LE(RelL2(merged_decode, copies_decode), 1e-5);
  EXPECT_LE(RelL2(merged_chunk, copies_chunk), 1e-5);
  EXPECT_GT(RelL2(plain_decode, copies_decode), 1e-2);
  EXPECT_GT(RelL2(plain_chunk, copies_chunk), 1e-2);

  // The mass the daemon's scores get: a merged slot's is its copies' total.
  ASSERT_EQ(merged_mass.size(), 24u);  // 20 + 1 + 3
  ASSERT_EQ(copies_mass.size(), 27u);  // 23 + 1 + 3
  for (int s = 0; s < 24; ++s) {
    double want = s < kContext ? copies_mass[s] : copies_mass[s + 3];
    if (s == 5) want += copies_mass[20] + copies_mass[21];
    if (s == 17) want += copies_mass[22];
    EXPECT_NEAR(merged_mass[s], want, 1e-4 * std::max(1.0, want)) << "slot " << s;
  }
}

// A table whose counts are all 1 (nothing merged) gives the kernels no bias:
// the outputs are bit-identical to a store that never saw counts, also after
// a merged table was adopted before it.
TEST(PagedKvStoreCountsTest, AllOnesCountsLeaveTheUnmergedPathUnchanged) {
  std::mt19937 rng(Seed());
  const Rows context = RandomRows(kContext, rng), more = RandomRows(2, rng);
  const std::vector<float> q_context = RandomQ(kContext, rng), q_more = RandomQ(2, rng);
  const Rows decode = RandomRows(1, rng);
  const std::vector<float> q_decode = RandomQ(1, rng);

  Store ones = NewStore();
  Step(ones.store.get(), context, q_context, 0);
  ones.src->Publish(MergedCounts());
  Step(ones.store.get(), more, q_more, 50);
  ones.src->Publish(std::vector<uint32_t>(kContext + 2, 1));
  const std::vector<float> got = Step(ones.store.get(), decode, q_decode, 100);
  EXPECT_EQ(ones.store->epoch(), 2u);

  Store never = NewStore();
  Step(never.store.get(), context, q_context, 0);
  Step(never.store.get(), more, q_more, 50);
  const std::vector<float> want = Step(never.store.get(), decode, q_decode, 100);
  EXPECT_EQ(got, want);
}

TEST(PagedKvStoreCountsTest, BadCountsAreRefused) {
  std::mt19937 rng(Seed());
  const Rows context = RandomRows(kContext, rng);
  const std::vector<float> q_context = RandomQ(kContext, rng);
  const std::vector<StepToken> one = {{7, 100, 0, Role::kUser}};
  struct Case {
    std::vector<uint32_t> counts;
    const char* message;
  };
  std::vector<uint32_t> zero = MergedCounts();
  zero[9] = 0;
  for (const Case& c : {Case{zero, "slot 9 with count 0"},
                        Case{std::vector<uint32_t>(kContext - 1, 2), "19 slot counts for 20"},
                        Case{std::vector<uint32_t>(kContext + 1, 1), "21 slot counts for 20"}}) {
    SCOPED_TRACE(c.message);
    Store s = NewStore();
    Step(s.store.get(), context, q_context, 0);
    s.src->Publish(c.counts);
    const absl::Status st = s.store->BeginStep(one);
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
    EXPECT_NE(st.message().find(c.message), std::string_view::npos) << st;
    EXPECT_EQ(s.store->epoch(), 0u);  // nothing adopted
  }
}

// Three steps of the layer tests: a context of kHeld tokens, one decode
// token, a chunk of 3.
constexpr int kHeld = 40;  // blocks 0 and 1 full, 8 rows of block 2
struct LayerSteps {
  explicit LayerSteps(std::mt19937& rng)
      : context(RandomRows(kHeld, rng)),
        decode(RandomRows(1, rng)),
        chunk(RandomRows(3, rng)),
        q_context(RandomQ(kHeld, rng)),
        q_decode(RandomQ(1, rng)),
        q_chunk(RandomQ(3, rng)) {}
  Rows context, decode, chunk;
  std::vector<float> q_context, q_decode, q_chunk;
};

// A layer may start at a later block than the others (a table whose layers
// hold different numbers of slots, the newest ones): it attends exactly as a
// store holding only its slots, the other layers as before, and a table
// where a layer lacks the block being filled is refused.
TEST(PagedKvStoreLayersTest, ALayerThatStartsLaterAttendsOnlyToItsNewestSlots) {
  std::mt19937 rng(Seed());
  const LayerSteps steps(rng);
  const auto& [context, decode, chunk, q_context, q_decode, q_chunk] = steps;
  const size_t per_token = size_t(kQHeads) * kHeadDim;
  auto layer_out = [&](const std::vector<float>& out, int layer, int n) {
    const auto* first = out.data() + layer * n * per_token;
    return std::vector<float>(first, first + n * per_token);
  };

  Store apart = NewStore();  // layer 1 without block 0
  Step(apart.store.get(), context, q_context, 0);
  apart.src->Publish({}, {{0, 0}, {0, 1}});
  const std::vector<float> apart_decode = Step(apart.store.get(), decode, q_decode, 100);
  ASSERT_EQ(apart.store->epoch(), 1u);
  const std::vector<float> apart_chunk = Step(apart.store.get(), chunk, q_chunk, 101);
  EXPECT_EQ(apart.store->pending_attention_mass().size(), size_t(kHeld + 4));

  Store all = NewStore();  // every layer holds all 40
  Step(all.store.get(), context, q_context, 0);
  all.src->Publish({});
  const std::vector<float> all_decode = Step(all.store.get(), decode, q_decode, 100);
  const std::vector<float> all_chunk = Step(all.store.get(), chunk, q_chunk, 101);

  std::vector<int> newest;  // slots 16..39
  for (int s = kBlock; s < kHeld; ++s) newest.push_back(s);
  Store few = NewStore();  // every layer holds the newest 24
  Step(few.store.get(), Pick(context, newest), RandomQ(kHeld - kBlock, rng), 0);
  const std::vector<float> few_decode = Step(few.store.get(), decode, q_decode, 100);
  const std::vector<float> few_chunk = Step(few.store.get(), chunk, q_chunk, 101);

  EXPECT_LE(RelL2(layer_out(apart_decode, 0, 1), layer_out(all_decode, 0, 1)), 1e-6);
  EXPECT_LE(RelL2(layer_out(apart_chunk, 0, 3), layer_out(all_chunk, 0, 3)), 1e-6);
  EXPECT_LE(RelL2(layer_out(apart_decode, 1, 1), layer_out(few_decode, 1, 1)), 1e-6);
  EXPECT_LE(RelL2(layer_out(apart_chunk, 1, 3), layer_out(few_chunk, 1, 3)), 1e-6);
  EXPECT_GT(RelL2(layer_out(apart_decode, 1, 1), layer_out(all_decode, 1, 1)), 1e-3);

  // Layer 1 without block 2, which holds the newest rows: refused.
  Store bad = NewStore();
  Step(bad.store.get(), context, q_context, 0);
  bad.src->Publish({}, {{0, 0}, {0, 3}});
  const std::vector<StepToken> one = {{7, 100, 0, Role::kUser}};
  const absl::Status st = bad.store->BeginStep(one);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("layer 1"), std::string_view::npos) << st;
  EXPECT_EQ(bad.store->epoch(), 0u);
}

// A layer may hold none of a run of blocks in the middle (its hole, after
// the blocks of a shared prefix kept in place): it attends exactly as a
// store holding only the slots around the hole, and its attention mass
// lands on those slots.
TEST(PagedKvStoreLayersTest, ALayerWithAHoleAttendsToTheSlotsAroundIt) {
  std::mt19937 rng(Seed());
  const LayerSteps steps(rng);
  const auto& [context, decode, chunk, q_context, q_decode, q_chunk] = steps;

  Store apart = NewStore();  // both layers without block 1
  Step(apart.store.get(), context, q_context, 0);
  apart.src->Publish({}, {{1, 2}, {1, 2}});
  const std::vector<float> apart_decode = Step(apart.store.get(), decode, q_decode, 100);
  ASSERT_EQ(apart.store->epoch(), 1u);
  const std::vector<float> apart_mass = apart.store->pending_attention_mass();
  const std::vector<float> apart_chunk = Step(apart.store.get(), chunk, q_chunk, 101);

  std::vector<int> around;  // slots 0..15 and 32..39
  for (int s = 0; s < kHeld; ++s) {
    if (s < kBlock || s >= 2 * kBlock) around.push_back(s);
  }
  Store few = NewStore();  // every layer holds those 24 alone
  Step(few.store.get(), Pick(context, around), RandomQ(int(around.size()), rng), 0);
  few.src->Publish({});
  const std::vector<float> few_decode = Step(few.store.get(), decode, q_decode, 100);
  const std::vector<float> few_mass = few.store->pending_attention_mass();
  const std::vector<float> few_chunk = Step(few.store.get(), chunk, q_chunk, 101);

  EXPECT_LE(RelL2(apart_decode, few_decode), 1e-6);
  EXPECT_LE(RelL2(apart_chunk, few_chunk), 1e-6);
  ASSERT_EQ(apart_mass.size(), size_t(kHeld + 1));
  ASSERT_EQ(few_mass.size(), around.size() + 1);
  for (size_t i = 0; i < around.size(); ++i) {
    EXPECT_NEAR(apart_mass[size_t(around[i])], few_mass[i], 1e-5) << "slot " << around[i];
  }
  for (int s = kBlock; s < 2 * kBlock; ++s) EXPECT_EQ(apart_mass[size_t(s)], 0.0f) << s;
  EXPECT_NEAR(apart_mass[kHeld], few_mass.back(), 1e-5);
}

}  // namespace
}  // namespace polykv::worker
