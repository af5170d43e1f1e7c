// A polykvd in the test's own process, and its fd socket alone over a pool:
// the setups the daemon's unit tests share.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "daemon/rpc/fd_broker.h"
#include "tests/unit/daemon/socket_peers.h"

namespace polykv::daemon {

// A 64 MiB host pool on a socket in a fresh folder named after `name`, no
// metrics server, open to root, this uid and testing::kOtherUid.
inline DaemonConfig SmallDaemonConfig(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "polykv-rpc-", getpid(), "-", name);
  mkdir(dir.c_str(), 0700);
  DaemonConfig c;
  c.socket = dir + "/d.sock";
  c.metrics_address = "off";
  c.pool_bytes = 64ull << 20;
  c.arena_bytes = 8ull << 20;
  c.allowed_uids = {0, geteuid(), testing::kOtherUid};
  return c;
}

// Created and started; nullptr (with the test failed) when either fails.
inline std::unique_ptr<Daemon> StartDaemon(const DaemonConfig& c) {
  auto d = Daemon::Create(c);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  auto s = (*d)->Start();
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? *std::move(d) : nullptr;
}

struct TestFdBroker {
  std::unique_ptr<FdBroker> broker;  // null (the test failed) when not created
  std::string path;
};

// `pool`'s fd socket alone, started, at a path named after `name`.
inline TestFdBroker StartFdBroker(KvPool* pool, const std::string& name, mode_t mode,
                                  std::set<uid_t> allowed_uids) {
  FdBrokerOptions o;
  o.path = ::testing::TempDir() + name + "-" + std::to_string(getpid()) + ".sock";
  o.mode = mode;
  o.policy.allowed_uids = std::move(allowed_uids);
  o.pool = pool;
  auto broker = FdBroker::Create(o);
  EXPECT_TRUE(broker.ok()) << broker.status();
  if (!broker.ok()) return {nullptr, o.path};
  (*broker)->Start();
  return {*std::move(broker), o.path};
}

}  // namespace polykv::daemon
