// The offload tiers below the pool: what goes in comes back byte for byte,
// from host memory and from disk; host memory spills to disk oldest first;
// full tiers refuse and lose nothing; a file changed on disk, or left by an
// earlier run, is never served.
#include "daemon/memory/offload_store.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/memory/crc32c.h"

namespace polykv::daemon {
namespace {

namespace fs = std::filesystem;

// Pages of the given sizes, filled from `seed`.
struct Pages {
  std::vector<std::vector<std::byte>> data;
  Pages(std::vector<size_t> sizes, uint32_t seed) {
    std::mt19937 rng(seed);
    for (size_t n : sizes) {
      auto& p = data.emplace_back(n);
      for (auto& b : p) b = std::byte(rng());
    }
  }
  std::vector<std::span<const std::byte>> in() const {
    return {data.begin(), data.end()};
  }
  std::vector<std::span<std::byte>> out() { return {data.begin(), data.end()}; }
  Pages Blank() const {
    Pages b({}, 0);
    for (const auto& p : data) b.data.emplace_back(p.size());
    return b;
  }
};

class OffloadStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("polykv-offload-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::unique_ptr<OffloadStore> Make(uint64_t host, uint64_t disk, uint32_t instance = 7) {
    auto s = OffloadStore::Create({host, disk ? dir_.string() : "", disk, instance});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  size_t Files() const {
    size_t n = 0;
    for (const auto& f : fs::directory_iterator(dir_)) n += f.is_regular_file();
    return n;
  }
  fs::path dir_;
};

TEST(Crc32cTest, KnownValueAndChaining) {
  const std::string text = "123456789";
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  EXPECT_EQ(Crc32c(bytes), 0xE3069283u);  // the standard check value of CRC-32C
  EXPECT_EQ(Crc32c(bytes.subspan(4), Crc32c(bytes.first(4))), 0xE3069283u);
  std::vector<std::byte> odd(1001, std::byte{0x5A});  // tail bytes past the 8-byte words
  EXPECT_EQ(Crc32c(odd), Crc32c(std::span(odd).subspan(3), Crc32c(std::span(odd).first(3))));
}

TEST_F(OffloadStoreTest, HostAndDiskGiveBackTheSameBytes) {
  auto store = Make(/*host=*/64 << 10, /*disk=*/1 << 20);
  Pages small({4096, 256, 4096, 1000}, 1);
  Pages large({128 << 10, 256}, 2);  // larger than the host tier: straight to disk
  ASSERT_TRUE(store->Put(1, small.in()).ok());
  ASSERT_TRUE(store->Put(2, large.in()).ok());
  EXPECT_EQ(store->Where(1), OffloadTier::kHost);
  EXPECT_EQ(store->Where(2), OffloadTier::kDisk);
  for (auto [key, pages] : {std::pair{1, &small}, std::pair{2, &large}}) {
    Pages back = pages->Blank();
    ASSERT_TRUE(store->Get(key, back.out()).ok());
    EXPECT_EQ(back.data, pages->data) << "entry " << key;
  }
  const auto st = store->stats();
  EXPECT_EQ(st.host_bytes, 4096u + 256 + 4096 + 1000);
  EXPECT_EQ(st.host_entries, 1u);
  EXPECT_EQ(st.disk_entries, 1u);
  EXPECT_EQ(Files(), 1u);
  store->Drop(1);
  store->Drop(2);
  EXPECT_EQ(Files(), 0u);
  EXPECT_EQ(store->stats().host_bytes + store->stats().disk_bytes, 0u);
  EXPECT_TRUE(absl::IsNotFound(store->Get(1, small.out())));
}

TEST_F(OffloadStoreTest, HostMemorySpillsOldestFirstToDisk) {
  auto store = Make(/*host=*/10000, /*disk=*/1 << 20);
  Pages a({4000}, 1), b({4000}, 2), c({4000}, 3);
  ASSERT_TRUE(store->Put(1, a.in()).ok());
  ASSERT_TRUE(store->Put(2, b.in()).ok());
  ASSERT_TRUE(store->Put(3, c.in()).ok());  // 12000 > 10000: entry 1 goes to disk
  EXPECT_EQ(store->Where(1), OffloadTier::kDisk);
  EXPECT_EQ(store->Where(2), OffloadTier::kHost);
  EXPECT_EQ(store->Where(3), OffloadTier::kHost);
  EXPECT_EQ(store->stats().spilled, 1u);
  Pages back = a.Blank();
  ASSERT_TRUE(store->Get(1, back.out()).ok());
  EXPECT_EQ(back.data, a.data);
}

TEST_F(OffloadStoreTest, FullTiersRefuseAndLoseNothing) {
  auto store = Make(/*host=*/5000, /*disk=*/5000);
  Pages a({4000}, 1), b({4000}, 2), c({4000}, 3);
  ASSERT_TRUE(store->Put(1, a.in()).ok());
  ASSERT_TRUE(store->Put(2, b.in()).ok());  // 1 spills to disk
  const absl::Status full = store->Put(3, c.in());
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_NE(full.message().find("no room for 4000 bytes"), std::string::npos) << full;
  EXPECT_FALSE(store->Where(3).has_value());
  for (auto [key, pages] : {std::pair{1, &a}, std::pair{2, &b}}) {
    Pages back = pages->Blank();
    ASSERT_TRUE(store->Get(key, back.out()).ok()) << key;
    EXPECT_EQ(back.data, pages->data) << key;
  }
  EXPECT_EQ(Files(), 1u);
  // Host memory alone: no disk to spill to.
  auto host_only = Make(/*host=*/5000, /*disk=*/0);
  ASSERT_TRUE(host_only->Put(1, a.in()).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(host_only->Put(2, b.in())));
  EXPECT_EQ(host_only->Where(1), OffloadTier::kHost);
}

TEST_F(OffloadStoreTest, ADiskThatFailsWritesIsAClearErrorAndKeepsTheEntryInMemory) {
  auto store = Make(/*host=*/5000, /*disk=*/1 << 20);
  Pages a({4000}, 1), b({4000}, 2);
  ASSERT_TRUE(store->Put(1, a.in()).ok());
  // The directory can take no file: every write fails (ENOTDIR here; ENOSPC
  // is RESOURCE_EXHAUSTED, the same path otherwise).
  fs::remove_all(dir_);
  std::ofstream(dir_.string()) << "not a directory";
  const absl::Status st = store->Put(2, b.in());
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(store->Where(2).has_value());
  EXPECT_EQ(store->Where(1), OffloadTier::kHost);  // the spill failed: it stays
  Pages back = a.Blank();
  ASSERT_TRUE(store->Get(1, back.out()).ok());
  EXPECT_EQ(back.data, a.data);
  EXPECT_GE(store->stats().disk_errors, 1u);
  fs::remove(dir_);
}

TEST_F(OffloadStoreTest, AFileChangedOnDiskIsDataLossNotServed) {
  auto store = Make(/*host=*/0, /*disk=*/1 << 20);
  Pages a({4096, 4096}, 1);
  ASSERT_TRUE(store->Put(1, a.in()).ok());
  fs::path file = fs::directory_iterator(dir_)->path();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40 + 5000);
    f.put('\x01');
  }
  Pages back = a.Blank();
  const absl::Status st = store->Get(1, back.out());
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st;
  EXPECT_FALSE(store->Where(1).has_value());  // dropped
  EXPECT_EQ(store->stats().corrupt, 1u);
  EXPECT_EQ(Files(), 0u);
}

TEST_F(OffloadStoreTest, AnEarlierRunsFilesAreRemovedAndAForeignHeaderIsRefused) {
  Pages a({4096}, 1);
  {
    auto first = Make(/*host=*/0, /*disk=*/1 << 20, /*instance=*/1);
    ASSERT_TRUE(first->Put(1, a.in()).ok());
    // A crash leaves the file behind: copy it aside as the crash would.
    fs::copy_file(fs::directory_iterator(dir_)->path(), dir_ / "polykv-offload-stale.kv");
  }
  std::ofstream(dir_ / "keep.txt") << "not ours";
  auto second = Make(/*host=*/0, /*disk=*/1 << 20, /*instance=*/2);
  EXPECT_EQ(Files(), 1u);  // only keep.txt
  EXPECT_TRUE(fs::exists(dir_ / "keep.txt"));
  // A file whose header names another entry is not served for this one.
  ASSERT_TRUE(second->Put(1, a.in()).ok());
  ASSERT_TRUE(second->Put(2, a.in()).ok());
  fs::path one, two;
  for (const auto& f : fs::directory_iterator(dir_)) {
    const std::string name = f.path().filename().string();
    if (name.ends_with("0000000000000001.kv")) one = f.path();
    if (name.ends_with("0000000000000002.kv")) two = f.path();
  }
  ASSERT_FALSE(one.empty());
  ASSERT_FALSE(two.empty());
  fs::copy_file(two, one, fs::copy_options::overwrite_existing);
  Pages back = a.Blank();
  const absl::Status st = second->Get(1, back.out());
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find("header"), std::string::npos) << st;
}

TEST_F(OffloadStoreTest, WrongSizesAndBadOptionsAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(OffloadStore::Create({0, "", 0, 1}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(OffloadStore::Create({0, dir_.string(), 0, 1}).status()));
  auto store = Make(/*host=*/1 << 20, /*disk=*/0);
  Pages a({4096, 256}, 1);
  ASSERT_TRUE(store->Put(1, a.in()).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(store->Put(1, a.in())));
  Pages wrong({4096, 512}, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Get(1, wrong.out())));
  Pages back = a.Blank();
  ASSERT_TRUE(store->Get(1, back.out()).ok());  // still there
  EXPECT_EQ(back.data, a.data);
}

}  // namespace
}  // namespace polykv::daemon
