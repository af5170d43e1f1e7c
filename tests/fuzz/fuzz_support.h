// What the fuzz targets share: the abort that reports a finding, the status
// oracle, and the small in-process pool they run against.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "daemon/pool/kv_pool.h"
#include "google/protobuf/message.h"

namespace polykv::fuzz {

// Prints `what` and aborts: the crash a fuzzer records (and the standalone
// driver's test failure).
[[noreturn]] void Fail(std::string_view what);

// Fails unless `s` is OK.
void CheckOk(const absl::Status& s, std::string_view what);

// A call given a caller's bytes may refuse them with any expected code
// (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, ...), never with one that
// daemon::IsUnexpected names (INTERNAL, UNKNOWN, DATA_LOSS): those mean the
// daemon broke, not the request.
void CheckRefusal(const absl::Status& s, std::string_view call);

// Serializes `m` and parses the bytes back into a fresh message: a string
// field the daemon filled with invalid UTF-8 (or anything else the client's
// parser rejects) fails here instead of at the worker.
void CheckRoundTrip(const google::protobuf::Message& m, std::string_view what);

// 2 MiB of host arenas in 512 KiB arenas of 64 KiB superblocks: room for a
// few sessions and a compaction, small enough that large Reserves run the
// pool out (a normal refusal) and that CheckInvariants, which visits every
// page in use, stays cheap enough to run after each command. `clock` is the
// pool's.
// `watcher` tells the pool which workers live (empty: none is watched).
std::unique_ptr<daemon::KvPool> MakeFuzzPool(daemon::Clock clock,
                                             daemon::ProcessWatcher watcher = {});

// An OpenRequest that succeeds: 2 layers x 2 heads x 32 dims of f16.
daemon::OpenRequest FuzzOpenRequest(const std::string& agent, const std::string& tenant,
                                    const daemon::PeerCreds& peer);

}  // namespace polykv::fuzz
