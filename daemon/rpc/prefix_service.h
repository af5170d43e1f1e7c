// gRPC PrefixCache service (proto/polykv/v1/prefix.proto): an engine's
// connector finds, reads and stores prefix blocks with no session. Checks
// and translation only; the pool decides.
#pragma once

#include "daemon/rpc/service_context.h"
#include "polykv/v1/prefix.grpc.pb.h"

namespace polykv::daemon {

class PrefixService final : public v1::PrefixCache::Service {
 public:
  explicit PrefixService(ServiceContext ctx) : ctx_(std::move(ctx)) {}

  grpc::Status LookupPrefix(grpc::ServerContext* c, const v1::LookupPrefixRequest* req,
                            v1::LookupPrefixResponse* resp) override;
  grpc::Status ReadPrefix(grpc::ServerContext* c, const v1::ReadPrefixRequest* req,
                          v1::ReadPrefixResponse* resp) override;
  grpc::Status StorePrefix(grpc::ServerContext* c, const v1::StorePrefixRequest* req,
                           v1::StorePrefixResponse* resp) override;

 private:
  const ServiceContext ctx_;
};

}  // namespace polykv::daemon
