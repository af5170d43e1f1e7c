// One soak agent: a thread with its own client connection that churns
// sessions against polykvd until `end` (tests/soak/soak_test.cc says what it
// does and what the soak checks).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "polykv/v1/common.pb.h"
#include "tests/soak/tally.h"

namespace polykv::testing {

using SoakClock = std::chrono::steady_clock;

// polykvd's lease in the soak: a loaded 2-core box must not cost live
// sessions their lease.
inline constexpr int kSoakLeaseMs = 3000;

struct SoakContext {
  std::string socket;  // polykvd's gRPC socket
  SoakClock::time_point end;
  uint64_t seed = 0;       // agent i draws from seed * 7919 + i
  Tally* tally = nullptr;  // not owned; shared by all agents
};

// The QoS record of agent i ("soak-<i>"), set through the Admin API before
// the agents start.
v1::QosRecord QosOf(int i);

// Runs agent i until c.end; returns with all its sessions closed.
// Thread-safety: one call per agent, any number at once.
void Agent(const SoakContext& c, int i);

}  // namespace polykv::testing
