// The mutual TLS of the peer link (polykvd to polykvd, Peer service): one
// certificate and key per daemon, both ends checked against one CA. Read
// once at start from the config's peer.cert / peer.key / peer.ca.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ServerCredentials;
class ChannelCredentials;
}  // namespace grpc

namespace polykv::daemon {

struct PeerTls {
  std::string cert_pem;  // this daemon's certificate chain (server and client use)
  std::string key_pem;
  std::string ca_pem;    // whom to trust, both ways
};

// INVALID_ARGUMENT naming the file when one is missing, unreadable or not PEM.
absl::StatusOr<PeerTls> LoadPeerTls(const std::string& cert, const std::string& key,
                                    const std::string& ca);
// The listener's: a client certificate is required and checked.
std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(const PeerTls& tls);
// The dialer's: the target's certificate is checked, name included.
std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(const PeerTls& tls);

}  // namespace polykv::daemon
