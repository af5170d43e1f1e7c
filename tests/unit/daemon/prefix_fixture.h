// The shared-prefix tests' fixture: PagedSessionTest's workers that share
// and attach prefixes by token ids (prefix_sharing_test.cc,
// prefix_connector_test.cc).
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "tests/unit/daemon/paged_session_fixture.h"

namespace polykv::daemon {

class PrefixSharingTest : public PagedSessionTest {
 protected:
  // Token ids of a context: n ids from `seed` on.
  static std::vector<int32_t> Ids(size_t n, int32_t seed = 100) {
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), seed);
    return ids;
  }

  // Attaches like a worker: the shared blocks become the session's first
  // committed tokens, positions 0 .. n - 1.
  absl::StatusOr<uint64_t> Attach(Sess& s, const std::vector<int32_t>& ids) {
    auto r = pool_->AttachPrefix(s.id, s.token, peer_, ids);
    if (!r.ok()) return r.status();
    Map(s.id, s.token, r->reserve.new_arenas);
    s.blocks = r->reserve.blocks;
    s.committed = r->attached_tokens;
    s.positions.resize(s.committed);
    std::iota(s.positions.begin(), s.positions.end(), 0);
    s.next_pos = static_cast<int64_t>(s.committed);
    EXPECT_EQ(r->reserve.reserved_tokens, s.committed);
    return s.committed;
  }

  absl::StatusOr<uint64_t> Share(const Sess& s, const std::vector<int32_t>& ids) {
    return pool_->SharePrefix(s.id, s.token, peer_, ids);
  }

  // A session of `agent` that wrote n tokens (whole blocks) and shared them.
  Sess Sharer(const std::string& agent, int n) {
    Sess s = Open(agent);
    EXPECT_TRUE(Append(s, n).ok());
    EXPECT_EQ(Share(s, Ids(n)).value(), uint64_t(n));
    return s;
  }
  // A fresh session of `agent` that attached those n tokens.
  Sess Attacher(const std::string& agent, int n) {
    Sess s = Open(agent);
    EXPECT_EQ(Attach(s, Ids(n)).value(), uint64_t(n));
    return s;
  }

  static constexpr uint64_t kBlockBytes = 2ull * kLayers * kBlock * kHeads * kDim * 4;
};

}  // namespace polykv::daemon
