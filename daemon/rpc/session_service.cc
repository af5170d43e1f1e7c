#include "daemon/rpc/session_service.h"

#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/log.h"
#include "daemon/rpc/convert.h"
#include "daemon/rpc/log_throttle.h"
#include "daemon/rpc/watch_quota.h"

namespace polykv::daemon {
namespace {

// A line about a session of `uid` (opened, closed, refused): a burst per
// period for each uid and kind, then counted (one worker opening and closing
// in a loop wrote 1.3 MB/s of log).
void LogSessionLine(const ServiceContext& ctx, uid_t uid, absl::string_view kind,
                    const std::string& line) {
  if (ctx.session_log == nullptr) {
    DaemonLogger()->info("{}", line);
    return;
  }
  auto skipped = ctx.session_log->Admit(absl::StrCat(kind, ":uid", uid));
  if (!skipped) return;
  if (*skipped == 0) {
    DaemonLogger()->info("{}", line);
  } else {
    DaemonLogger()->info("{} ({} more {} lines of uid {} not logged before this one)", line,
                         *skipped, std::string(kind), uid);
  }
}

}  // namespace

grpc::Status SessionService::OpenSession(grpc::ServerContext* c,
                                         const v1::OpenSessionRequest* req,
                                         v1::OpenSessionResponse* resp) {
  return Handle(ctx_, c, "OpenSession", [&](const PeerCreds& peer) -> absl::Status {
    auto r = FromProto(*req, peer);
    if (!r.ok()) return r.status();
    auto out = ctx_.pool->Open(*r);
    if (!out.ok()) return out.status();
    ToProto(*out, resp);
    resp->set_fd_socket_path(ctx_.fd_socket_path);
    LogSessionLine(ctx_, peer.uid, "open",
                   absl::StrCat("session ", out->session_id, " opened: agent ", r->agent_id,
                                " tenant ", r->tenant, " pid ", peer.pid, " uid ", peer.uid, ", ",
                                r->profile.num_layers, " layers, K/V ",
                                std::string(kernels::FormatShortName(out->key_format)), "/",
                                std::string(kernels::FormatShortName(out->value_format))));
    return absl::OkStatus();
  });
}

grpc::Status SessionService::AttachSession(grpc::ServerContext* c,
                                           const v1::AttachSessionRequest* req,
                                           v1::OpenSessionResponse* resp) {
  return Handle(ctx_, c, "AttachSession", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->Attach(req->session().session_id(), req->session().token(), peer);
    if (!out.ok()) return out.status();
    ToProto(*out, resp);
    resp->set_fd_socket_path(ctx_.fd_socket_path);
    LogSessionLine(ctx_, peer.uid, "open",
                   absl::StrCat("session ", out->session_id, " attached (moved here): agent ",
                                out->qos.agent_id, " pid ", peer.pid, " uid ", peer.uid));
    return absl::OkStatus();
  });
}

grpc::Status SessionService::Reserve(grpc::ServerContext* c, const v1::ReserveRequest* req,
                                     v1::ReserveResponse* resp) {
  return Handle(ctx_, c, "Reserve", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->Reserve(req->session().session_id(), req->session().token(), peer,
                                  req->num_tokens());
    if (!out.ok()) {
      if (absl::IsResourceExhausted(out.status())) {
        LogSessionLine(ctx_, peer.uid, "refusal",
                       absl::StrCat("session ", req->session().session_id(),
                                    ": reservation refused: ", out.status().message()));
      }
      return out.status();
    }
    for (const auto& b : out->blocks) ToProto(b, resp->add_blocks());
    resp->set_reserved_tokens(out->reserved_tokens);
    resp->set_session_bytes(out->session_bytes);
    for (const auto& a : out->new_arenas) ToProto(a, resp->add_new_arenas());
    return absl::OkStatus();
  });
}

grpc::Status SessionService::SharePrefix(grpc::ServerContext* c,
                                         const v1::SharePrefixRequest* req,
                                         v1::SharePrefixResponse* resp) {
  return Handle(ctx_, c, "SharePrefix", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->SharePrefix(req->session().session_id(), req->session().token(), peer,
                                      TokenIds(req->token_ids()));
    if (!out.ok()) return out.status();
    resp->set_shared_tokens(*out);
    return absl::OkStatus();
  });
}

grpc::Status SessionService::AttachPrefix(grpc::ServerContext* c,
                                          const v1::AttachPrefixRequest* req,
                                          v1::AttachPrefixResponse* resp) {
  return Handle(ctx_, c, "AttachPrefix", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->AttachPrefix(req->session().session_id(), req->session().token(),
                                       peer, TokenIds(req->token_ids()));
    if (!out.ok()) return out.status();
    resp->set_attached_tokens(out->attached_tokens);
    for (const auto& b : out->reserve.blocks) ToProto(b, resp->add_blocks());
    resp->set_session_bytes(out->reserve.session_bytes);
    for (const auto& a : out->reserve.new_arenas) ToProto(a, resp->add_new_arenas());
    return absl::OkStatus();
  });
}

grpc::Status SessionService::Commit(grpc::ServerContext* c, const v1::CommitRequest* req,
                                    v1::CommitResponse* resp) {
  return Handle(ctx_, c, "Commit", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->Commit(req->session().session_id(), req->session().token(), peer,
                                 req->committed_tokens());
    if (!out.ok()) return out.status();
    resp->set_committed_tokens(*out);
    return absl::OkStatus();
  });
}

grpc::Status SessionService::Sync(grpc::ServerContext* c, const v1::SyncRequest* req,
                                  v1::SyncResponse* resp) {
  return Handle(ctx_, c, "Sync", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->Sync(req->session().session_id(), req->session().token(), peer,
                               req->known_epoch(), req->then_idle());
    if (!out.ok()) return out.status();
    if (out->moved_to) {
      resp->mutable_moved_to()->set_socket_path(out->moved_to->socket_path);
      resp->mutable_moved_to()->mutable_session()->set_session_id(out->moved_to->session_id);
      resp->mutable_moved_to()->mutable_session()->set_token(out->moved_to->token);
      return absl::OkStatus();
    }
    resp->set_parked(out->parked);
    resp->set_same_slots(out->same_slots);
    resp->set_epoch(out->epoch);
    resp->set_changed(out->changed);
    for (const auto& b : out->blocks) ToProto(b, resp->add_blocks());
    resp->set_committed_tokens(out->committed_tokens);
    for (const auto& a : out->new_arenas) ToProto(a, resp->add_new_arenas());
    resp->mutable_slot_positions()->Add(out->slot_positions.begin(), out->slot_positions.end());
    resp->mutable_slot_counts()->Add(out->slot_counts.begin(), out->slot_counts.end());
    SetWanted(out->wants, resp);
    resp->mutable_layer_slot_positions()->Add(out->layer_slot_positions.begin(),
                                              out->layer_slot_positions.end());
    return absl::OkStatus();
  });
}

grpc::Status SessionService::Ack(grpc::ServerContext* c, const v1::AckRequest* req,
                                 v1::AckResponse*) {
  return Handle(ctx_, c, "Ack", [&](const PeerCreds& peer) {
    return ctx_.pool->Ack(req->session().session_id(), req->session().token(), peer,
                          req->epoch());
  });
}

grpc::Status SessionService::Release(grpc::ServerContext* c, const v1::ReleaseRequest* req,
                                     v1::ReleaseResponse* resp) {
  return Handle(ctx_, c, "Release", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->Release(req->session().session_id(), req->session().token(), peer,
                                  req->keep_tokens());
    if (!out.ok()) return out.status();
    resp->set_reserved_tokens(out->reserved_tokens);
    resp->set_committed_tokens(out->committed_tokens);
    resp->set_session_bytes(out->session_bytes);
    return absl::OkStatus();
  });
}

grpc::Status SessionService::CloseSession(grpc::ServerContext* c,
                                          const v1::CloseSessionRequest* req,
                                          v1::CloseSessionResponse* resp) {
  return Handle(ctx_, c, "CloseSession", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->Close(req->session().session_id(), req->session().token(), peer);
    if (!out.ok()) return out.status();
    LogSessionLine(ctx_, peer.uid, "close",
                   absl::StrCat("session ", req->session().session_id(), " closed, ", *out,
                                " bytes freed"));
    resp->set_freed_bytes(*out);
    return absl::OkStatus();
  });
}

grpc::Status SessionService::Heartbeat(grpc::ServerContext* c, const v1::HeartbeatRequest* req,
                                       v1::HeartbeatResponse* resp) {
  return Handle(ctx_, c, "Heartbeat", [&](const PeerCreds& peer) -> absl::Status {
    auto out = ctx_.pool->Heartbeat(req->session().session_id(), req->session().token(), peer);
    if (!out.ok()) return out.status();
    resp->set_lease_ms(out->lease_ms);
    resp->set_epoch(out->epoch);
    resp->set_draining(out->draining);
    return absl::OkStatus();
  });
}

grpc::Status SessionService::ReportSlots(grpc::ServerContext* c,
                                         const v1::ReportSlotsRequest* req,
                                         v1::ReportSlotsResponse* resp) {
  return Handle(ctx_, c, "ReportSlots", [&](const PeerCreds& peer) -> absl::Status {
    auto r = FromProto(*req);
    if (!r.ok()) return r.status();
    if (auto s = ctx_.pool->ReportSlots(req->session().session_id(), req->session().token(),
                                        peer, *r);
        !s.ok()) {
      return s;
    }
    resp->set_epoch(r->epoch);
    return absl::OkStatus();
  });
}

grpc::Status SessionService::Watch(grpc::ServerContext* c, const v1::WatchRequest* req,
                                   grpc::ServerWriter<v1::SessionEvent>* writer) {
  std::shared_ptr<EventChannel> channel;
  uid_t watcher_uid = 0;
  grpc::Status opened = Handle(ctx_, c, "Watch", [&](const PeerCreds& peer) -> absl::Status {
    auto ch = ctx_.pool->Watch(req->session().session_id(), req->session().token(), peer);
    if (!ch.ok()) return ch.status();
    if (ctx_.watches && !ctx_.watches->Acquire(peer.uid)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", peer.uid, " already holds ", ctx_.watches->per_uid(),
          " Watch streams, the most one uid may (max_watch_streams_per_uid); cancel one first, "
          "or raise the limit in polykvd's config"));
    }
    if (!(*ch)->AddWatcher()) {
      if (ctx_.watches) ctx_.watches->Release(peer.uid);
      return absl::ResourceExhaustedError(absl::StrCat(
          "session ", req->session().session_id(), " already has ", EventChannel::kMaxWatchers,
          " Watch streams; cancel one first"));
    }
    watcher_uid = peer.uid;
    channel = *std::move(ch);
    return absl::OkStatus();
  });
  if (!opened.ok()) return opened;
  // Poll for cancellation between waits: a sync stream handler has no other
  // way to notice that the worker went away.
  while (!c->IsCancelled()) {
    auto event = channel->Next(absl::Milliseconds(200));
    if (event) {
      v1::SessionEvent e;
      e.set_type(static_cast<v1::SessionEvent::Type>(event->type));
      e.set_epoch(event->epoch);
      e.set_message(event->message);
      if (!writer->Write(e)) break;
    } else if (channel->Closed()) {
      break;
    }
  }
  channel->RemoveWatcher();
  if (ctx_.watches) ctx_.watches->Release(watcher_uid);
  return grpc::Status::OK;
}

}  // namespace polykv::daemon
