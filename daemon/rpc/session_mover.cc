#include "daemon/rpc/session_mover.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/rpc/move_convert.h"
#include "daemon/rpc/status_map.h"
#include "polykv/v1/peer.grpc.pb.h"

namespace polykv::daemon {
namespace {

// Pages per message up to this many bytes (a page is at most a superblock):
// few enough messages for the stream's per-message cost not to matter, and
// well under the peer listener's message limit (kMaxPeerMessageBytes).
constexpr size_t kChunkBytes = 1 << 20;

// Streams the parked session; the target's reply names the session there.
absl::StatusOr<v1::ImportSessionResponse> Stream(const MoveSource& src, const std::string& target,
                                                 const PeerTls& tls) {
  auto channel = grpc::CreateChannel(target, PeerChannelCredentials(tls));
  auto stub = v1::Peer::NewStub(channel);
  grpc::ClientContext ctx;
  // Generous for the bytes (at 20 MB/s, a slow link), bounded all the same:
  // the worker waits parked meanwhile.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30) +
                   std::chrono::milliseconds(src.bytes / 20000));
  v1::ImportSessionResponse resp;
  auto writer = stub->ImportSession(&ctx, &resp);
  v1::ImportSessionRequest req;
  ToProto(src.session, req.mutable_session());
  bool ok = writer->Write(req);
  for (size_t p = 0; ok && p < src.pages.size();) {
    v1::ImportSessionRequest chunk;
    v1::PageData* d = chunk.mutable_pages();
    d->set_first_page(p);
    std::string* data = d->mutable_data();
    size_t n = 0;
    for (size_t q = p; q < src.pages.size() && (q == p || n + src.pages[q].size() <= kChunkBytes);
         ++q) {
      n += src.pages[q].size();
    }
    data->resize(n);
    char* out = data->data();
    while (p < src.pages.size() && out < data->data() + n) {
      std::memcpy(out, src.pages[p].data(), src.pages[p].size());
      out += src.pages[p].size();
      ++p;
    }
    ok = writer->Write(chunk);
  }
  if (ok) writer->WritesDone();
  const grpc::Status s = writer->Finish();
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp;
}

double Seconds(absl::Time from, absl::Time to) { return absl::ToDoubleSeconds(to - from); }

}  // namespace

absl::StatusOr<MoveStats> SessionMover::Move(uint64_t session_id, const std::string& target,
                                             absl::Duration wait) {
  if (target.empty()) return absl::InvalidArgumentError("target: the peer's host:port is required");
  const absl::Time start = absl::Now();
  auto src = pool_->ParkForMove(session_id, wait);
  if (!src.ok()) return src.status();
  const absl::Time parked = absl::Now();
  auto resp = Stream(*src, target, tls_);
  const absl::Time copied = absl::Now();
  if (!resp.ok()) {
    pool_->AbortMove(session_id);
    return absl::Status(resp.status().code(),
                        absl::StrCat("moving session ", session_id, " to ", target, " failed: ",
                                     resp.status().message(),
                                     "; the session stays here and its worker goes on"));
  }
  if (auto st = pool_->FinishMove(
          session_id, MovedTo{resp->socket_path(), resp->session_id(), resp->token()});
      !st.ok()) {
    // Evicted here during the move: the copy there expires with its lease.
    return st;
  }
  MoveStats out;
  out.target_session_id = resp->session_id();
  out.bytes = src->bytes;
  out.tokens = src->session.committed_tokens;
  out.park_seconds = Seconds(start, parked);
  out.copy_seconds = Seconds(parked, copied);
  out.pause_seconds = Seconds(parked, absl::Now());
  return out;
}

}  // namespace polykv::daemon
