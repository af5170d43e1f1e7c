// What a request protobuf cannot parse gets: INVALID_ARGUMENT naming the
// method, not gRPC's INTERNAL with an empty message (finding 9 of issue 14),
// and one log line per method per period instead of one per request.
//
// gRPC's sync server deserializes a request before any handler of ours runs;
// when that fails it calls no handler and answers with the status protobuf's
// deserializer returned (INTERNAL, ""). An interceptor sees the failure at
// POST_RECV_MESSAGE (GetRecvMessage() is null) and rewrites the status at
// PRE_SEND_STATUS.
//
// Protobuf itself logs a line for each string field that is not valid UTF-8
// (GOOGLE_LOG(ERROR), to stderr). RouteProtobufLogs() sends those lines to
// the daemon's log through a LogThrottle.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "daemon/metrics/metrics.h"
#include "daemon/rpc/log_throttle.h"

namespace polykv::daemon {

class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `metrics` may be null (tests). Both outlive the server.
  explicit ParseErrorInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  Metrics* const metrics_;  // Not owned.
  LogThrottle throttle_{{.period = absl::Seconds(10)}};
};

// Installs protobuf's log handler (process-wide): its lines go to the daemon's
// log, at most one per source line per 10 s. Idempotent.
void RouteProtobufLogs();

}  // namespace polykv::daemon
