#include "daemon/rpc/parse_errors.h"

#include <google/protobuf/stubs/logging.h>

#include <mutex>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "daemon/log.h"

namespace polykv::daemon {
namespace {

using grpc::experimental::InterceptionHookPoints;

// gRPC's message when a call ended before its request arrived whole (the
// client cancelled, or died mid-send, as SIGKILLed workers do): nothing was
// sent to parse and nobody reads the answer, so it is neither rewritten nor
// logged (the soak's killed workers made it one warning every few seconds).
constexpr std::string_view kNoPayload = "Couldn't initialize byte buffer reader";

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  ParseErrorInterceptor(std::string method, Metrics* metrics, LogThrottle* throttle)
      : method_(std::move(method)), metrics_(metrics), throttle_(throttle) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparseable_ = true;
    }
    if (unparseable_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_message() != kNoPayload) {
      Report(methods->GetSendStatus());
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("polykvd could not parse the request to ", method_,
                       " (not a valid protobuf message of its type: garbage, truncated, or a "
                       "string field that is not valid UTF-8)")));
    }
    methods->Proceed();
  }

 private:
  void Report(const grpc::Status& original) {
    // The handler never ran, so Handle() did not count this call.
    if (metrics_) {
      metrics_->ObserveRpc(method_.substr(method_.rfind('/') + 1), "INVALID_ARGUMENT", 0);
    }
    if (auto skipped = throttle_->Admit(method_)) {
      DaemonLogger()->warn(
          "rpc {}: unparseable request refused with INVALID_ARGUMENT (gRPC said code {} '{}'); "
          "{} more like it since the last line",
          method_, static_cast<int>(original.error_code()), original.error_message(), *skipped);
    }
  }

  const std::string method_;
  Metrics* const metrics_;
  LogThrottle* const throttle_;
  bool unparseable_ = false;  // Calls run their hooks one at a time.
};

LogThrottle& ProtobufLogThrottle() {
  static LogThrottle* throttle = new LogThrottle({.period = absl::Seconds(10)});
  return *throttle;
}

void ProtobufLogHandler(google::protobuf::LogLevel level, const char* file, int line,
                        const std::string& message) {
  // A fatal line precedes protobuf's abort: never swallow it.
  const bool fatal = level == google::protobuf::LOGLEVEL_FATAL;
  auto skipped = ProtobufLogThrottle().Admit(absl::StrCat(file, ":", line));
  if (!skipped && !fatal) return;
  const spdlog::level::level_enum lvl =
      fatal ? spdlog::level::critical
            : level == google::protobuf::LOGLEVEL_ERROR ? spdlog::level::err
            : level == google::protobuf::LOGLEVEL_WARNING ? spdlog::level::warn
                                                          : spdlog::level::info;
  DaemonLogger()->log(lvl, "protobuf {}:{}: {} ({} more from there since the last line)", file,
                      line, message, skipped.value_or(0));
}

}  // namespace

grpc::experimental::Interceptor* ParseErrorInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new ParseErrorInterceptor(info->method() ? info->method() : "(unknown method)",
                                   metrics_, &throttle_);
}

void RouteProtobufLogs() {
  // SetLogHandler is not thread-safe: set it once, before a server parses.
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&ProtobufLogHandler); });
}

}  // namespace polykv::daemon
