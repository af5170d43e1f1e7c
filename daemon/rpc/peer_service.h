// gRPC Peer service: another polykvd moves a session here (peer.proto). It
// listens on TCP with mutual TLS only (peer_tls.h): the TLS handshake is
// the authorization; the session's worker identity comes from the source
// and is checked against this daemon's tenants like an OpenSession.
#pragma once

#include <string>

#include "daemon/rpc/service_context.h"
#include "polykv/v1/peer.grpc.pb.h"

namespace polykv::daemon {

// The largest message the peer listener takes: the mover sends pages in
// chunks of about 1 MiB (a chunk holds at least one page, at most a
// superblock), and the session header (slot records) may be larger.
inline constexpr int kMaxPeerMessageBytes = 64 << 20;

class PeerService final : public v1::Peer::Service {
 public:
  // `socket_path`: this daemon's session socket, where the worker attaches.
  PeerService(ServiceContext ctx, std::string socket_path)
      : ctx_(std::move(ctx)), socket_path_(std::move(socket_path)) {}
  grpc::Status ImportSession(grpc::ServerContext* c,
                             grpc::ServerReader<v1::ImportSessionRequest>* reader,
                             v1::ImportSessionResponse* resp) override;

 private:
  const ServiceContext ctx_;
  const std::string socket_path_;
};

}  // namespace polykv::daemon
