// FaultTest: a real polykvd per test (lease 1.5 s, so reclaims come quickly)
// for the fault/ suite, and the probes its tests share.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/integration/daemon_process.h"

namespace polykv::testing {

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.socket = MakeTempDir("polykv-fault") + "/d.sock";
    auto d = DaemonProcess::Start(options_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
  }
  void TearDown() override {
    if (daemon_) {
      EXPECT_EQ(daemon_->Stop(SIGTERM), 0) << "polykvd did not exit cleanly on SIGTERM";
    }
  }

  std::vector<std::string> Worker(const std::string& mode, const std::string& tenant,
                                  const std::string& agent, uint64_t tokens, uint64_t seed,
                                  const std::vector<std::string>& extra = {}) {
    return TestWorker(options_.socket, mode, tenant, agent, tokens, seed, extra);
  }

  uint64_t NumSessions() {
    auto s = daemon_->Stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->num_sessions() : ~0ull;
  }

  DaemonOptions options_;
  std::unique_ptr<DaemonProcess> daemon_;
};

}  // namespace polykv::testing
