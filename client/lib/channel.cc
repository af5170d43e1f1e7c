#include "client/lib/channel.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace polykv::internal {

absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& socket_path,
                                                    int timeout_ms) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel("unix:" + socket_path,
                                           grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(timeout_ms))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach polykvd at ", socket_path,
        " (is it running, and is this user allowed by its socket mode and allowed_uids?)"));
  }
  return channel;
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void SetDeadline(grpc::ClientContext* ctx, int ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

}  // namespace polykv::internal
