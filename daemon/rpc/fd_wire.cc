#include "daemon/rpc/fd_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/polykv/v1/fd_socket.h"

namespace polykv::daemon {

absl::StatusOr<FdWireRequest> ParseFdRequest(absl::string_view bytes) {
  if (bytes.size() != sizeof(v1::FdRequest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd request of ", bytes.size(), " bytes; it must be ", sizeof(v1::FdRequest)));
  }
  // Copied, not cast: the bytes need not be aligned for the struct.
  v1::FdRequest req;
  std::memcpy(&req, bytes.data(), sizeof(req));
  if (req.magic != v1::kFdMagic || req.version != v1::kFdVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad fd request header (magic/version ", req.magic, "/", req.version, ")"));
  }
  FdWireRequest out;
  out.session_id = req.session_id;
  out.token.assign(reinterpret_cast<const char*>(req.token), sizeof(req.token));
  out.arena_id = req.arena_id;
  return out;
}

}  // namespace polykv::daemon
