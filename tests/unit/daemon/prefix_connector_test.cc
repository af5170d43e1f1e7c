// The prefix cache without a session, as an engine's connector uses it
// (issue 42): blocks a worker shared are found and read byte for byte;
// blocks stored by their token ids are attached by a worker's session and
// hold what was stored, slot by slot; stores come in chunks, in order; other
// tenants, unbound uids and other spaces find nothing; bad calls change
// nothing; accounting exact after every step. Last, the same over the
// daemon's socket: a connector process's stores attached by a worker's
// session, the bytes read in its mapped pages.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/pool/kv_pool.h"
#include "polykv/client.h"
#include "polykv/prefix_cache.h"
#include "tests/unit/daemon/in_process_daemon.h"
#include "tests/unit/daemon/prefix_fixture.h"

namespace polykv::daemon {
namespace {

class PrefixConnectorTest : public PrefixSharingTest {
 protected:
  void Configure(KvPoolOptions& o) override {
    o.tenant_bindings["bound"] = TenantBinding{{getuid() + 1}, {}};
  }

  PrefixSpaceRequest Space(const std::string& tenant = "t1") const {
    PrefixSpaceRequest r;
    r.tenant = tenant;
    r.profile = {kLayers, kHeads, kDim, DType::kF32, "tiny"};
    r.key_format = r.value_format = PageFormat::kF32;
    r.block_tokens = kBlock;
    r.peer = peer_;
    return r;
  }

  absl::StatusOr<uint64_t> Store(const PrefixSpaceRequest& space, const std::vector<int32_t>& ids,
                                 uint64_t first_block, const std::vector<std::string>& pages) {
    const std::vector<std::string_view> views(pages.begin(), pages.end());
    return pool_->StorePrefix(space, ids, first_block, views);
  }

  // The page bytes of a session's first `blocks` blocks, in PrefixPages' layout.
  std::vector<std::string> PagesOf(const Sess& s, size_t blocks) {
    std::vector<std::string> out;
    for (size_t b = 0; b < blocks; ++b) {
      for (int l = 0; l < kLayers; ++l) {
        for (int v = 0; v < 2; ++v) {
          const PageDesc* p = PageOf(s.blocks[b], l, v);
          out.emplace_back(reinterpret_cast<const char*>(Addr(*p)), kPageBytes);
        }
      }
    }
    return out;
  }

  // Pool state a refused call must leave as it was.
  std::vector<uint64_t> Snapshot() {
    const PoolSummary st = pool_->Stats();
    return {st.used_bytes, st.prefix_shared_bytes, st.prefix_cached_bytes, st.num_pages};
  }

  static constexpr uint64_t kPageBytes = uint64_t(kBlock) * kHeads * kDim * 4;  // f32
};

TEST_F(PrefixConnectorTest, AWorkersSharedBlocksAreFoundAndReadByteForByte) {
  Sess a = Sharer("a", 48);
  EXPECT_EQ(pool_->LookupPrefix(Space(), Ids(48)).value(), 48u);
  EXPECT_EQ(pool_->LookupPrefix(Space(), Ids(40)).value(), 32u);  // whole blocks only
  EXPECT_EQ(pool_->LookupPrefix(Space(), Ids(48, 7)).value(), 0u);

  auto read = pool_->ReadPrefix(Space(), Ids(48), 1, 8);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->first_block, 1u);
  EXPECT_EQ(read->blocks, 2u);  // blocks 1 and 2: the chain ends there
  const std::vector<std::string> want = PagesOf(a, 3);
  ASSERT_EQ(read->pages.size(), 2u * 2 * kLayers);
  for (size_t i = 0; i < read->pages.size(); ++i) {
    EXPECT_EQ(read->pages[i], want[2 * kLayers + i]) << "page " << i;
  }
  // Past the chain: nothing, and no error.
  EXPECT_EQ(pool_->ReadPrefix(Space(), Ids(48), 3, 8).value().blocks, 0u);
  Check();
}

TEST_F(PrefixConnectorTest, StoredBlocksAreAttachedByASessionSlotBySlot) {
  // An engine computed the KV of 48 tokens (here: a worker's pages, which
  // hold the fixture's pattern of each position) and stores it in two calls.
  Sess writer = Open("writer");
  ASSERT_TRUE(Append(writer, 48).ok());
  const std::vector<std::string> pages = PagesOf(writer, 3);
  ASSERT_TRUE(pool_->Close(writer.id, writer.token, peer_).ok());
  const auto ids = Ids(48, 500);
  const size_t per_block = 2 * kLayers;
  std::vector<std::string> first(pages.begin(), pages.begin() + per_block);
  std::vector<std::string> rest(pages.begin() + per_block, pages.end());
  EXPECT_EQ(Store(Space(), ids, 0, first).value(), 1u);
  Check();
  EXPECT_EQ(Store(Space(), ids, 1, rest).value(), 3u);
  Check();
  PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.prefix_cached_bytes, 3 * kBlockBytes);  // held by no session
  EXPECT_EQ(st.used_bytes, 3 * kBlockBytes);
  // Stored again: kept, nothing new.
  EXPECT_EQ(Store(Space(), ids, 0, pages).value(), 3u);
  EXPECT_EQ(pool_->Stats().used_bytes, 3 * kBlockBytes);

  Sess b = Open("b");
  ASSERT_EQ(Attach(b, ids).value(), 48u);
  VerifyContent(b);  // every slot holds its position's pattern
  ASSERT_TRUE(Append(b, 20).ok());  // and the session goes on from there
  VerifyContent(b);
  st = pool_->Stats();
  EXPECT_EQ(st.prefix_shared_bytes, 3 * kBlockBytes);
  EXPECT_EQ(st.prefix_cached_bytes, 0u);
  Check();
  ASSERT_TRUE(pool_->Close(b.id, b.token, peer_).ok());
  EXPECT_EQ(pool_->Stats().prefix_cached_bytes, 3 * kBlockBytes);
  Check();
}

TEST_F(PrefixConnectorTest, OtherTenantsUnboundUidsAndOtherSpacesFindNothing) {
  Sharer("a", 32);
  EXPECT_EQ(pool_->LookupPrefix(Space("t2"), Ids(32)).value(), 0u);
  EXPECT_EQ(pool_->ReadPrefix(Space("t2"), Ids(32), 0, 2).value().blocks, 0u);
  PrefixSpaceRequest other_model = Space();
  other_model.profile.model_id = "other";
  EXPECT_EQ(pool_->LookupPrefix(other_model, Ids(32)).value(), 0u);
  PrefixSpaceRequest other_format = Space();
  other_format.value_format = PageFormat::kF16;
  EXPECT_EQ(pool_->LookupPrefix(other_format, Ids(32)).value(), 0u);
  // A tenant bound to other uids: refused, whatever the call.
  const std::vector<std::string> pages(2 * kLayers, std::string(kPageBytes, '\0'));
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->LookupPrefix(Space("bound"), Ids(32)).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(pool_->ReadPrefix(Space("bound"), Ids(32), 0, 1).status()));
  EXPECT_TRUE(
      absl::IsPermissionDenied(Store(Space("bound"), Ids(16), 0, pages).status()));
  Check();
}

TEST_F(PrefixConnectorTest, BadCallsAreRefusedAndChangeNothing) {
  const std::vector<std::string> block(2 * kLayers, std::string(kPageBytes, 'x'));
  ASSERT_EQ(Store(Space(), Ids(32), 0, block).value(), 1u);
  const auto before = Snapshot();
  auto refused = [&](const absl::Status& s, absl::StatusCode code) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_EQ(Snapshot(), before) << s;
    Check();
  };
  // A page of the wrong size, a block short of a page, no pages.
  std::vector<std::string> wrong = block;
  wrong[3].pop_back();
  refused(Store(Space(), Ids(32), 1, wrong).status(),
          absl::StatusCode::kInvalidArgument);
  refused(Store(Space(), Ids(32), 1, {block.begin(), block.begin() + 3}).status(),
          absl::StatusCode::kInvalidArgument);
  refused(Store(Space(), Ids(32), 1, {}).status(),
          absl::StatusCode::kInvalidArgument);
  // Too few token ids for the blocks given.
  refused(Store(Space(), Ids(31), 1, block).status(),
          absl::StatusCode::kInvalidArgument);
  // A first block past any context (and past what uint64 arithmetic holds).
  refused(Store(Space(), Ids(32), ~uint64_t{0}, block).status(),
          absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->ReadPrefix(Space(), Ids(32), ~uint64_t{0}, 4).value().blocks, 0u);
  // Block 2 before block 1.
  refused(Store(Space(), Ids(48), 2, block).status(),
          absl::StatusCode::kFailedPrecondition);
  // A space that cannot be: no block size, no layers, a bad tenant name.
  PrefixSpaceRequest bad = Space();
  bad.block_tokens = 0;
  refused(pool_->LookupPrefix(bad, Ids(32)).status(), absl::StatusCode::kInvalidArgument);
  bad = Space();
  bad.profile.num_layers = 0;
  refused(Store(bad, Ids(32), 1, block).status(),
          absl::StatusCode::kInvalidArgument);
  refused(pool_->LookupPrefix(Space("no/slash"), Ids(32)).status(),
          absl::StatusCode::kInvalidArgument);
  // What was stored is still there, untouched.
  auto read = pool_->ReadPrefix(Space(), Ids(32), 0, 4);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->blocks, 1u);
  EXPECT_EQ(read->pages, block);
}

TEST_F(PrefixConnectorTest, StoredBlocksGoFirstWhenSessionsNeedTheRoom) {
  pool_ = MakePool(2 * kMiB);
  arenas_.Reset(pool_.get());
  const std::vector<std::string> block(2 * kLayers, std::string(kPageBytes, 'y'));
  std::vector<std::string> four;
  for (int i = 0; i < 4; ++i) four.insert(four.end(), block.begin(), block.end());
  ASSERT_EQ(Store(Space(), Ids(64), 0, four).value(), 4u);
  // A session wants the whole pool: the stored blocks make room, the
  // newest chain's last blocks first.
  Sess c = Open("c");
  const uint64_t blocks = 2 * kMiB / kBlockBytes - 2;
  auto appended = Append(c, static_cast<int>(blocks * kBlock));
  ASSERT_TRUE(appended.ok()) << appended;
  const PoolSummary st = pool_->Stats();
  EXPECT_EQ(st.prefix_dropped_blocks, 2u);
  EXPECT_EQ(pool_->LookupPrefix(Space(), Ids(64)).value(), 32u);
  VerifyContent(c);
  Check();
  // Now the pool holds the session and two cached blocks: a new chain takes
  // their room (the older go first) and is refused past it; what it stored
  // stays, and the session's pages are untouched.
  auto full = Store(Space(), Ids(64, 900), 0, four);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_EQ(pool_->LookupPrefix(Space(), Ids(64, 900)).value(), 32u);
  EXPECT_EQ(pool_->LookupPrefix(Space(), Ids(64)).value(), 0u);
  VerifyContent(c);
  Check();
}

TEST(PrefixCacheRpcTest, AConnectorsBlocksReachAWorkersSessionThroughTheSocket) {
  const DaemonConfig c = SmallDaemonConfig("prefix-connector");
  auto daemon = StartDaemon(c);
  ASSERT_NE(daemon, nullptr);
  auto cache = PrefixCacheClient::Connect(c.socket);
  ASSERT_TRUE(cache.ok()) << cache.status();
  v1::PrefixSpace space;
  space.set_tenant("t1");
  space.mutable_profile()->set_num_layers(kLayers);
  space.mutable_profile()->set_num_kv_heads(kHeads);
  space.mutable_profile()->set_head_dim(kDim);
  space.mutable_profile()->set_dtype(v1::DTYPE_F32);
  space.mutable_profile()->set_model_id("tiny");
  space.set_block_tokens(kBlock);  // formats unspecified: f32, the dtype's
  const size_t page_bytes = size_t(kBlock) * kHeads * kDim * 4;
  std::vector<std::string> pages;
  for (int p = 0; p < 2 * 2 * kLayers; ++p) {  // two blocks
    std::string page(page_bytes, '\0');
    for (size_t k = 0; k < page_bytes; ++k) page[k] = char((p * 131 + k * 7) % 251);
    pages.push_back(std::move(page));
  }
  std::vector<int32_t> ids(2 * kBlock);
  std::iota(ids.begin(), ids.end(), 40);

  EXPECT_EQ((*cache)->Lookup(space, ids).value(), 0u);
  EXPECT_EQ((*cache)->Store(space, ids, 0, pages).value(), 2u);
  EXPECT_EQ((*cache)->Lookup(space, ids).value(), uint64_t(2 * kBlock));
  auto read = (*cache)->Read(space, ids, 0, 8);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->blocks(), 2u);
  EXPECT_TRUE(std::equal(pages.begin(), pages.end(), read->pages().begin()));
  // Refused with the reason, over the wire too.
  std::vector<std::string> short_page = pages;
  short_page[0].pop_back();
  auto bad = (*cache)->Store(space, ids, 0, short_page);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  v1::PrefixSpace other = space;
  other.set_tenant("t2");
  EXPECT_EQ((*cache)->Lookup(other, ids).value(), 0u);

  // A worker's session of that space attaches the blocks and finds the
  // connector's bytes in its own mapped pages.
  auto client = Client::Connect(c.socket);
  ASSERT_TRUE(client.ok()) << client.status();
  SessionOptions o;
  o.agent_id = "w";
  o.tenant = "t1";
  o.profile = {kLayers, kHeads, kDim, DType::kF32, "tiny"};
  o.block_tokens = kBlock;
  o.key_format = o.value_format = PageFormat::kF32;  // the space's (else the default QoS's)
  auto session = (*client)->OpenSession(o);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->AttachPrefix(ids).value(), uint64_t(2 * kBlock));
  const auto& blocks = (*session)->blocks();
  ASSERT_EQ(blocks.size(), 2u);
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (size_t i = 0; i < blocks[b].pages.size(); ++i) {
      const polykv::Page& page = blocks[b].pages[i];
      ASSERT_NE(page.addr, nullptr);
      EXPECT_EQ(std::memcmp(page.addr, pages[b * 2 * kLayers + i].data(), page_bytes), 0)
          << "block " << b << " page " << i;
    }
  }
}

}  // namespace
}  // namespace polykv::daemon
