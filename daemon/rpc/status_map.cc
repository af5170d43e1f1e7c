#include "daemon/rpc/status_map.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

bool IsUnexpected(absl::StatusCode code) {
  return code == absl::StatusCode::kInternal || code == absl::StatusCode::kUnknown ||
         code == absl::StatusCode::kDataLoss;
}

uint64_t ErrorLog::Record(absl::string_view rpc, const absl::Status& status, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const uint64_t incident = ++num_incidents_;
  if (now - window_start_ >= options_.window) {
    window_start_ = now;
    lines_in_window_ = 0;
  }
  if (lines_in_window_ >= options_.max_lines) {
    ++num_suppressed_;
    return incident;
  }
  ++lines_in_window_;
  std::string suppressed;
  if (num_suppressed_ > 0) {
    suppressed = absl::StrCat(" (", num_suppressed_, " earlier errors not logged: more than ",
                              options_.max_lines, " in ", absl::FormatDuration(options_.window), ")");
    num_suppressed_ = 0;
  }
  options_.logger->error("rpc {} failed, incident {}: {}{}", std::string(rpc), incident, status.ToString(), suppressed);
  return incident;
}

grpc::Status ToGrpc(const absl::Status& status, absl::string_view rpc, ErrorLog* log) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (!IsUnexpected(status.code())) return grpc::Status(code, std::string(status.message()));
  std::string where = rpc.empty() ? "" : absl::StrCat("rpc ", rpc);
  if (log != nullptr) {
    absl::StrAppend(&where, where.empty() ? "" : ", ", "incident ", log->Record(rpc, status));
  }
  return grpc::Status(code, absl::StrCat("internal error in polykvd", where.empty() ? "" : " (", where,
                                         where.empty() ? "" : ")", "; the daemon's log has the detail"));
}

}  // namespace polykv::daemon
