#include "daemon/rpc/peer_service.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/log.h"
#include "daemon/rpc/move_convert.h"

namespace polykv::daemon {
namespace {

// Writes the pages' bytes as they arrive: whole pages, in order.
absl::Status ReadPages(grpc::ServerReader<v1::ImportSessionRequest>* reader,
                       const ImportTarget& t) {
  size_t next = 0;
  v1::ImportSessionRequest req;
  while (reader->Read(&req)) {
    if (!req.has_pages()) {
      return absl::InvalidArgumentError("a second session header in one import");
    }
    const v1::PageData& d = req.pages();
    if (d.first_page() != next) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages out of order: got page ", d.first_page(), ", expected ", next));
    }
    const std::string& data = d.data();
    size_t at = 0;
    while (at < data.size()) {
      if (next >= t.pages.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("more page bytes than the session's ", t.pages.size(), " pages hold"));
      }
      const std::span<std::byte> page = t.pages[next];
      if (data.size() - at < page.size()) {
        return absl::InvalidArgumentError(absl::StrCat("page ", next, " cut short: ",
                                                       data.size() - at, " of ", page.size(),
                                                       " bytes (chunks carry whole pages)"));
      }
      std::memcpy(page.data(), data.data() + at, page.size());
      at += page.size();
      ++next;
    }
  }
  if (next != t.pages.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the stream ended after ", next, " of ", t.pages.size(), " pages"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status PeerService::ImportSession(grpc::ServerContext* c,
                                        grpc::ServerReader<v1::ImportSessionRequest>* reader,
                                        v1::ImportSessionResponse* resp) {
  const absl::Time start = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    v1::ImportSessionRequest first;
    if (!reader->Read(&first) || !first.has_session()) {
      return absl::InvalidArgumentError("an import starts with the session (header)");
    }
    auto moved = FromProto(first.session());
    if (!moved.ok()) return moved.status();
    auto target = ctx_.pool->BeginImport(*moved);
    if (!target.ok()) return target.status();
    if (auto st = ReadPages(reader, *target); !st.ok()) {
      ctx_.pool->AbortImport(target->session_id);
      return c->IsCancelled() ? absl::CancelledError("the source cancelled the move") : st;
    }
    auto done = ctx_.pool->CompleteImport(target->session_id);
    if (!done.ok()) return done.status();
    resp->set_session_id(done->session_id);
    resp->set_token(done->token);
    resp->set_socket_path(socket_path_);
    DaemonLogger()->info("session {} moved here from {}: agent {} tenant {}, {} tokens, {} bytes",
                         done->session_id, c->peer(), moved->agent_id, moved->tenant,
                         moved->committed_tokens, target->bytes);
    return absl::OkStatus();
  }();
  // Not Handle: a peer daemon is known by its TLS certificate, not by
  // Unix-socket credentials.
  return FinishRpc(ctx_, "ImportSession", start, status);
}

}  // namespace polykv::daemon
