// The fd socket's request (proto/polykv/v1/fd_socket.h) read from its bytes
// and checked, apart from the broker's socket handling so that it can be
// tested and fuzzed alone (tests/fuzz/fd_wire_fuzzer.cc).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace polykv::daemon {

// What a well-formed request asks for. The token and ids are the caller's
// claims; KvPool::DupArenaFd checks them.
struct FdWireRequest {
  uint64_t session_id = 0;
  std::string token;  // always v1::FdRequest's 32 bytes
  uint32_t arena_id = 0;
};

// `bytes` is one request as received: exactly sizeof(v1::FdRequest) bytes in
// host byte order (the socket is local). INVALID_ARGUMENT for a short or
// long request and for a wrong magic or version; the message is printable
// ASCII whatever the bytes were.
absl::StatusOr<FdWireRequest> ParseFdRequest(absl::string_view bytes);

}  // namespace polykv::daemon
