#include "daemon/metrics/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "daemon/pool/kv_pool.h"

namespace polykv::daemon {
namespace {

std::unique_ptr<KvPool> MakePool() {
  KvPoolOptions o;
  o.pool_bytes = 16ull << 20;
  o.arena_bytes = 4ull << 20;
  o.superblock_bytes = 256 * 1024;
  o.arena_factory = CreateHostShmArena;
  auto p = KvPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

bool HasFamily(const std::vector<prometheus::MetricFamily>& families, const std::string& name) {
  return std::any_of(families.begin(), families.end(),
                     [&](const prometheus::MetricFamily& f) { return f.name == name; });
}

// The invariant check walks every page under the pool lock; a scrape by any
// local uid must not be able to stall the workers with it.
TEST(PoolCollectorTest, AScrapeRunsNoInvariantCheckUnlessInDebugMode) {
  auto pool = MakePool();
  OpenRequest r;
  r.agent_id = "a";
  r.tenant = "t";
  r.profile = {4, 2, 64, DType::kF32, "tiny"};
  r.peer = {1234, 1000, 1000};
  auto s = pool->Open(r);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(pool->Reserve(s->session_id, s->token, r.peer, 40).ok());

  const auto plain = PoolCollector(pool.get(), /*check_invariants=*/false).Collect();
  EXPECT_TRUE(HasFamily(plain, "polykv_pool_bytes"));
  EXPECT_FALSE(HasFamily(plain, "polykv_pool_invariants_ok"));

  const auto debug = PoolCollector(pool.get(), /*check_invariants=*/true).Collect();
  auto it = std::find_if(debug.begin(), debug.end(), [](const prometheus::MetricFamily& f) {
    return f.name == "polykv_pool_invariants_ok";
  });
  ASSERT_NE(it, debug.end());
  ASSERT_EQ(it->metric.size(), 1u);
  EXPECT_EQ(it->metric[0].gauge.value, 1);
}

}  // namespace
}  // namespace polykv::daemon
