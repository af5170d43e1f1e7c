// The pool in GPU memory, across processes (CTest label gpu; skips without a
// CUDA build or device): polykvd --tier cuda exports its arenas, one worker
// process maps them (CUDA VMM fd over the fd socket) and writes its pages,
// another process maps the same arena and reads those bytes; a worker killed
// with SIGKILL while it holds a mapping leaves the pool empty and exact; the
// legacy IPC export still maps; the daemon compacts and merges a session's
// pages in device memory with the CUDA kernels (QoS set through the Admin
// API) and the worker finds every slot holding its position's values; an
// idle agent's device pages go to the offload tier and come back intact.
// scripts/gpu-check.sh runs these on a GPU.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/device.h"
#include "tests/integration/daemon_process.h"

namespace polykv::testing {
namespace {


class GpuPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::CudaBuilt()) GTEST_SKIP() << "built without CUDA";
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
  void StartDaemon(const std::string& cuda_export) {
    options_.socket = MakeTempDir("polykv-gpu-" + cuda_export) + "/d.sock";
    options_.extra_args = {"--tier", "cuda", "--cuda-export", cuda_export};
    auto d = DaemonProcess::Start(options_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
  }
  void TearDown() override {
    if (daemon_) {
      EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << "polykvd did not exit cleanly";
    }
  }
  std::vector<std::string> Worker(const std::string& mode, const std::string& agent,
                                  uint64_t seed, std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"--device", "1"});
    return TestWorker(options_.socket, mode, "gpu-tenant", agent, 64, seed, extra);
  }

  DaemonOptions options_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(GpuPoolTest, AnotherProcessReadsWhatAWorkerWroteThenAKillLeaksNothing) {
  StartDaemon("fd");
  Subprocess writer(Worker("hang", "writer", 7));
  const std::string line = writer.ReadLine();
  ASSERT_EQ(Field(line, "ok"), "true") << line;
  ASSERT_NE(Field(line, "page_bytes"), "") << line;

  // A second process, its own import of the same arena: the writer's bytes.
  Subprocess reader({BinDir() + "/polykv-test-worker", "peek", "--socket", options_.socket,
                     "--session", Field(line, "session_id"), "--token", Field(line, "token"),
                     "--arena", Field(line, "page_arena"), "--offset", Field(line, "page_offset"),
                     "--page-id", Field(line, "page_id"), "--page-bytes", Field(line, "page_bytes"),
                     "--seed", "7", "--cuda-device", Field(line, "cuda_device")});
  const std::string peeked = reader.ReadAll();
  EXPECT_EQ(reader.Wait(), 0) << peeked;
  EXPECT_EQ(Field(peeked, "ok"), "true") << peeked;
  EXPECT_EQ(Field(peeked, "checked_bytes"), Field(line, "page_bytes")) << peeked;

  // SIGKILL while the mapping is held: reclaimed after the lease, exactly.
  writer.Signal(SIGKILL);
  writer.Wait();
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
}

TEST_F(GpuPoolTest, TwoWorkersOnOneDeviceArenaKeepTheirOwnPages) {
  StartDaemon("fd");
  Subprocess a(Worker("run", "a", 1, {"--hold-ms", "500"}));
  Subprocess b(Worker("run", "b", 2, {"--hold-ms", "500"}));
  for (Subprocess* w : {&a, &b}) {
    const std::string out = w->ReadAll();
    EXPECT_EQ(w->Wait(), 0) << out;
    EXPECT_EQ(Field(out, "ok"), "true") << out;
  }
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
}

// The agent mode of polykv-test-worker checks, at every step boundary, that
// each slot of the table it adopted holds its position's pattern.
TEST_F(GpuPoolTest, TheDaemonCompactsAndMergesPagesInDeviceMemory) {
  StartDaemon("fd");
  for (const char* policy : {"h2o", "merge"}) {
    v1::QosRecord q;
    q.set_agent_id(std::string("compacted-") + policy);
    q.set_policy(policy);
    q.set_budget_tokens(256);
    ASSERT_TRUE(daemon_->admin().SetQos(q).ok()) << policy;
    Subprocess agent(TestWorker(options_.socket, "agent", "gpu-tenant", q.agent_id(), 1024, 5,
                                {"--step", "16", "--budget", "256", "--device", "1"}));
    const std::string out = agent.ReadLine(120000);
    EXPECT_EQ(agent.Wait(), 0) << policy << ": " << out;
    EXPECT_EQ(Field(out, "ok"), "true") << policy << ": " << out;
    EXPECT_GE(FieldNum(out, "compactions"), 1u) << policy << ": " << out;
  }
  const std::string page = daemon_->Metrics();
  EXPECT_LE(Sample(page, "polykv_ladder_steps_total{step=\"compaction_failed\"}"), 0) << page;
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
}

// An idle agent's device pages go to the host tier (through a host copy)
// and come back into new device pages at its next Sync, every slot holding
// its position's pattern.
TEST_F(GpuPoolTest, AnIdleAgentsDevicePagesComeBackFromTheOffloadTier) {
  options_.lease_ms = 1200;  // the reaper sweeps every 300 ms
  options_.socket = MakeTempDir("polykv-gpu-offload") + "/d.sock";
  options_.extra_args = {"--tier", "cuda", "--offload-host-bytes", "8MiB",
                         "--offload-idle-ms", "50"};
  auto d = DaemonProcess::Start(options_);
  ASSERT_TRUE(d.ok()) << d.status();
  daemon_ = *std::move(d);
  Subprocess agent(TestWorker(options_.socket, "agent", "gpu-tenant", "idler", 512, 9,
                              {"--step", "32", "--idle-every", "4", "--idle-ms", "900",
                               "--device", "1"}));
  const std::string out = agent.ReadLine(120000);
  EXPECT_EQ(agent.Wait(), 0) << out;
  EXPECT_EQ(Field(out, "ok"), "true") << out;
  EXPECT_EQ(Field(out, "idles"), "3") << out;
  const std::string page = daemon_->Metrics();
  EXPECT_GE(Sample(page, "polykv_offload_total{result=\"restored\"}"), 1) << page;
  EXPECT_EQ(Sample(page, "polykv_offload_total{result=\"lost\"}"), 0) << page;
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
}

TEST_F(GpuPoolTest, LegacyIpcExportStillMaps) {
  StartDaemon("ipc");
  Subprocess w(Worker("run", "legacy", 3));
  const std::string out = w.ReadAll();
  EXPECT_EQ(w.Wait(), 0) << out;
  EXPECT_EQ(Field(out, "ok"), "true") << out;
  EXPECT_EQ(WaitForPoolEmptyAndExact(*daemon_), "");
}

}  // namespace
}  // namespace polykv::testing
