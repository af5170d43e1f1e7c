// gRPC Admin service: operator calls, allowed only for admin uids.
#pragma once

#include "daemon/rpc/service_context.h"
#include "polykv/v1/admin.grpc.pb.h"

namespace polykv::daemon {

class AdminService final : public v1::Admin::Service {
 public:
  explicit AdminService(ServiceContext ctx) : ctx_(std::move(ctx)) {}

  grpc::Status GetStats(grpc::ServerContext* c, const v1::GetStatsRequest* req,
                        v1::Stats* resp) override;
  grpc::Status ListSessions(grpc::ServerContext* c, const v1::ListSessionsRequest* req,
                            v1::ListSessionsResponse* resp) override;
  grpc::Status GetQos(grpc::ServerContext* c, const v1::GetQosRequest* req,
                      v1::QosRecord* resp) override;
  grpc::Status SetQos(grpc::ServerContext* c, const v1::SetQosRequest* req,
                      v1::QosRecord* resp) override;
  grpc::Status EvictSession(grpc::ServerContext* c, const v1::EvictSessionRequest* req,
                            v1::EvictSessionResponse* resp) override;
  grpc::Status OffloadSession(grpc::ServerContext* c, const v1::OffloadSessionRequest* req,
                              v1::OffloadSessionResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext* c, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override;
  grpc::Status MoveSession(grpc::ServerContext* c, const v1::MoveSessionRequest* req,
                           v1::MoveSessionResponse* resp) override;

 private:
  template <typename Fn>
  grpc::Status AdminHandle(grpc::ServerContext* c, const std::string& rpc, Fn&& fn);

  const ServiceContext ctx_;
};

}  // namespace polykv::daemon
