// gRPC Session service: checks and translation only; the pool decides.
#pragma once

#include "daemon/rpc/service_context.h"
#include "polykv/v1/session.grpc.pb.h"

namespace polykv::daemon {

class SessionService final : public v1::Session::Service {
 public:
  explicit SessionService(ServiceContext ctx) : ctx_(std::move(ctx)) {}

  grpc::Status OpenSession(grpc::ServerContext* c, const v1::OpenSessionRequest* req,
                           v1::OpenSessionResponse* resp) override;
  grpc::Status AttachSession(grpc::ServerContext* c, const v1::AttachSessionRequest* req,
                             v1::OpenSessionResponse* resp) override;
  grpc::Status Reserve(grpc::ServerContext* c, const v1::ReserveRequest* req,
                       v1::ReserveResponse* resp) override;
  grpc::Status SharePrefix(grpc::ServerContext* c, const v1::SharePrefixRequest* req,
                           v1::SharePrefixResponse* resp) override;
  grpc::Status AttachPrefix(grpc::ServerContext* c, const v1::AttachPrefixRequest* req,
                            v1::AttachPrefixResponse* resp) override;
  grpc::Status Commit(grpc::ServerContext* c, const v1::CommitRequest* req,
                      v1::CommitResponse* resp) override;
  grpc::Status Sync(grpc::ServerContext* c, const v1::SyncRequest* req,
                    v1::SyncResponse* resp) override;
  grpc::Status Ack(grpc::ServerContext* c, const v1::AckRequest* req,
                   v1::AckResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* c, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* c, const v1::CloseSessionRequest* req,
                            v1::CloseSessionResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* c, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status ReportSlots(grpc::ServerContext* c, const v1::ReportSlotsRequest* req,
                           v1::ReportSlotsResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* c, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::SessionEvent>* writer) override;

 private:
  const ServiceContext ctx_;
};

}  // namespace polykv::daemon
