#include "daemon/rpc/peer_tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("peer.", what, " is not set"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("peer.", what, " ", path, ": cannot read"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("peer.", what, " ", path, ": not PEM"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<PeerTls> LoadPeerTls(const std::string& cert, const std::string& key,
                                    const std::string& ca) {
  PeerTls t;
  for (auto [path, what, out] : {std::tuple{&cert, "cert", &t.cert_pem},
                                 std::tuple{&key, "key", &t.key_pem},
                                 std::tuple{&ca, "ca", &t.ca_pem}}) {
    auto pem = ReadPem(*path, what);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  return t;
}

std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(const PeerTls& tls) {
  grpc::SslServerCredentialsOptions o(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls.ca_pem;
  o.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(const PeerTls& tls) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls.ca_pem;
  o.pem_private_key = tls.key_pem;
  o.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(o);
}

}  // namespace polykv::daemon
