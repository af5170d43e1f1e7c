#include "tests/fuzz/fuzz_support.h"

#include <cstdio>
#include <cstdlib>

#include "daemon/rpc/status_map.h"
#include "google/protobuf/stubs/logging.h"

namespace polykv::fuzz {
namespace {

// Protobuf logs each string field of invalid UTF-8 it refuses to parse;
// fuzz inputs have millions of them, and the refusal is what is tested.
const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

}  // namespace

void Fail(std::string_view what) {
  std::fprintf(stderr, "FUZZ FINDING: %.*s\n", static_cast<int>(what.size()), what.data());
  std::fflush(stderr);
  std::abort();
}

void CheckOk(const absl::Status& s, std::string_view what) {
  if (!s.ok()) Fail(std::string(what) + ": " + s.ToString());
}

void CheckRefusal(const absl::Status& s, std::string_view call) {
  if (daemon::IsUnexpected(s.code())) {
    Fail(std::string(call) + " returned " + s.ToString());
  }
}

void CheckRoundTrip(const google::protobuf::Message& m, std::string_view what) {
  std::string bytes;
  if (!m.SerializeToString(&bytes)) Fail(std::string(what) + ": does not serialize");
  std::unique_ptr<google::protobuf::Message> back(m.New());
  if (!back->ParseFromString(bytes)) {
    Fail(std::string(what) + ": serialized reply does not parse back: " + m.ShortDebugString());
  }
}

std::unique_ptr<daemon::KvPool> MakeFuzzPool(daemon::Clock clock,
                                             daemon::ProcessWatcher watcher) {
  daemon::KvPoolOptions o;
  o.pool_bytes = 2u << 20;
  o.arena_bytes = 512u << 10;
  o.superblock_bytes = 64u << 10;
  o.default_lease_ms = 1000;
  o.max_sessions = 64;
  o.instance = 1;  // fixed session ids: an input names the same session on every run
  o.arena_factory = daemon::CreateHostShmArena;
  o.clock = std::move(clock);
  o.process_watcher = std::move(watcher);
  auto p = daemon::KvPool::Create(o);
  CheckOk(p.status(), "KvPool::Create");
  return *std::move(p);
}

daemon::OpenRequest FuzzOpenRequest(const std::string& agent, const std::string& tenant,
                                    const daemon::PeerCreds& peer) {
  daemon::OpenRequest r;
  r.agent_id = agent;
  r.tenant = tenant;
  r.profile = {2, 2, 32, daemon::DType::kF16, "fuzz"};
  r.peer = peer;
  return r;
}

}  // namespace polykv::fuzz
