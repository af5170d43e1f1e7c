// Fuzz target: ParseFdRequest (daemon/rpc/fd_wire.h), the fd socket's
// request as the broker reads it. Any bytes: a request of the wrong size or
// header is INVALID_ARGUMENT with a printable message; a well-formed one
// gives back exactly the fields that were sent.
#include <cstdint>
#include <cstring>
#include <string>

#include "daemon/rpc/fd_wire.h"
#include "proto/polykv/v1/fd_socket.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using polykv::fuzz::Fail;
  namespace v1 = polykv::v1;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto r = polykv::daemon::ParseFdRequest(bytes);
  v1::FdRequest sent;
  const bool whole = size == sizeof(sent);
  if (whole) std::memcpy(&sent, data, sizeof(sent));
  const bool valid = whole && sent.magic == v1::kFdMagic && sent.version == v1::kFdVersion;
  if (r.ok() != valid) Fail(std::string("ParseFdRequest: ") + r.status().ToString());
  if (!r.ok()) {
    if (!absl::IsInvalidArgument(r.status())) Fail("ParseFdRequest: " + r.status().ToString());
    // The broker copies the message into FdReply.message for the worker.
    for (char c : r.status().message()) {
      if (c < 0x20 || c > 0x7e) Fail("ParseFdRequest: unprintable byte in the message");
    }
    return 0;
  }
  if (r->session_id != sent.session_id || r->arena_id != sent.arena_id ||
      r->token.size() != sizeof(sent.token) ||
      std::memcmp(r->token.data(), sent.token, sizeof(sent.token)) != 0) {
    Fail("ParseFdRequest: the fields differ from the bytes sent");
  }
  return 0;
}
