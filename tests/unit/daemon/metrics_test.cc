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

  const auto plain = PoolCollector(pool.get(), /*check_invariants=*/false, /*agent_names=*/false).Collect();
  EXPECT_TRUE(HasFamily(plain, "polykv_pool_bytes"));
  EXPECT_FALSE(HasFamily(plain, "polykv_pool_invariants_ok"));

  const auto debug = PoolCollector(pool.get(), /*check_invariants=*/true, /*agent_names=*/false).Collect();
  auto it = std::find_if(debug.begin(), debug.end(), [](const prometheus::MetricFamily& f) {
    return f.name == "polykv_pool_invariants_ok";
  });
  ASSERT_NE(it, debug.end());
  ASSERT_EQ(it->metric.size(), 1u);
  EXPECT_EQ(it->metric[0].gauge.value, 1);
}

// Agent labels of polykv_agent_bytes, in the order of the family.
std::vector<std::string> AgentLabels(const std::vector<prometheus::MetricFamily>& families) {
  std::vector<std::string> out;
  for (const auto& f : families) {
    if (f.name != "polykv_agent_bytes") continue;
    for (const auto& m : f.metric) out.push_back(m.label.at(0).value);
  }
  return out;
}

// /metrics answers any local uid without credentials: the names of agents
// (and so whose work runs on the node) are the operator's to publish.
TEST(PoolCollectorTest, AgentNamesAreOnMetricsOnlyWhereTheOperatorAllows) {
  auto pool = MakePool();
  std::vector<std::pair<std::string, uint64_t>> sessions;
  for (const std::string agent : {"alice-private-repo", "bob"}) {
    OpenRequest r;
    r.agent_id = agent;
    r.tenant = "t";
    r.profile = {4, 2, 64, DType::kF32, "tiny"};
    r.peer = {1234, 1000, 1000};
    auto s = pool->Open(r);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(pool->Reserve(s->session_id, s->token, r.peer, agent == "bob" ? 40 : 80).ok());
  }
  const PoolCollector hidden(pool.get(), /*check_invariants=*/false, /*agent_names=*/false);
  const auto first = AgentLabels(hidden.Collect());
  EXPECT_EQ(first, (std::vector<std::string>{"agent-1", "agent-2"}));
  // A pseudonym stays with its agent from scrape to scrape.
  EXPECT_EQ(AgentLabels(hidden.Collect()), first);
  const PoolCollector named(pool.get(), /*check_invariants=*/false, /*agent_names=*/true);
  EXPECT_EQ(AgentLabels(named.Collect()),
            (std::vector<std::string>{"alice-private-repo", "bob"}));
}

}  // namespace
}  // namespace polykv::daemon
