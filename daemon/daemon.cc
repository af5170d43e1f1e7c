#include "daemon/daemon.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <prometheus/text_serializer.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/log.h"
#include "daemon/metrics/http_server.h"
#include "daemon/memory/process_ref.h"
#include "daemon/metrics/metrics.h"
#include "daemon/pool/token.h"
#include "daemon/rpc/admin_service.h"
#include "daemon/rpc/fd_broker.h"
#include "daemon/rpc/log_throttle.h"
#include "daemon/rpc/parse_errors.h"
#include "daemon/rpc/peer_registry.h"
#include "daemon/rpc/peer_service.h"
#include "daemon/rpc/peer_tls.h"
#include "daemon/rpc/session_mover.h"
#include "daemon/rpc/prefix_service.h"
#include "daemon/rpc/session_service.h"
#include "daemon/rpc/status_map.h"
#include "daemon/rpc/uds_listener.h"
#include "daemon/rpc/watch_quota.h"

namespace polykv::daemon {
namespace {

// Big enough for a Reserve of 65536 tokens of a 128-layer model.
constexpr int kMaxMessageBytes = 64 << 20;

std::set<uid_t> OrDefaultUids(const std::vector<uid_t>& v) {
  if (!v.empty()) return {v.begin(), v.end()};
  return {0, geteuid()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonConfig& config) {
  if (auto s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<Daemon> d(new Daemon(config));
  KvPoolOptions po;
  po.tier = config.tier;
  po.pool_bytes = config.pool_bytes;
  po.low_watermark_bytes = config.low_watermark_bytes;
  po.arena_bytes = config.arena_bytes;
  po.superblock_bytes = config.superblock_bytes;
  po.default_block_tokens = config.block_tokens;
  po.default_lease_ms = config.lease_ms;
  po.max_sessions = config.max_sessions;
  po.max_sessions_per_uid = config.max_sessions_per_uid;
  po.max_tenants_per_uid = config.max_tenants_per_uid;
  po.tenant_bindings = config.tenants;
  po.operator_uids = {0, geteuid()};
  po.operator_uids.insert(config.admin_uids.begin(), config.admin_uids.end());
  po.default_qos = config.default_qos;
  // Workers' liveness decides when memory they map may change owner.
  po.process_watcher = PidfdWatcher();
  if (!PidfdsSupported()) {
    DaemonLogger()->warn(
        "this kernel has no pidfd_open (Linux < 5.3): pages taken from a live worker and retired "
        "arenas are reused at once, so a worker paused past its lease can write over them");
  }
  if (config.tier == "cuda") {
    const int device = config.cuda_device;
    po.arena_kind = config.cuda_export == "ipc" ? ArenaKind::kCudaIpc : ArenaKind::kCudaVmm;
    po.cuda_device = device;
    po.arena_factory = [device, kind = po.arena_kind](const ArenaOptions& o) {
      ArenaOptions with_device = o;
      with_device.cuda_device = device;
      return CreateCudaArena(kind, with_device);
    };
  } else {
    po.arena_kind = ArenaKind::kHostShm;
    po.arena_factory = CreateHostShmArena;
  }
  po.ladder_evict_idle = config.ladder_evict_idle;
  if (config.offload.on()) {
    // One instance for session ids and offload files: a file names the run
    // that wrote it.
    po.instance = DrawInstance();
    auto store = OffloadStore::Create({config.offload.host_bytes, config.offload.dir,
                                       config.offload.disk_bytes, po.instance});
    if (!store.ok()) return store.status();
    po.offload_store = *std::move(store);
    if (config.offload.idle_ms > 0) po.offload_idle = absl::Milliseconds(config.offload.idle_ms);
  }
  auto pool = KvPool::Create(po);
  if (!pool.ok()) return pool.status();
  d->pool_ = *std::move(pool);
  for (const QosRecord& q : config.agents) {
    if (auto s = d->pool_->SetQos(q); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("agent '", q.agent_id, "' in config: ", s.status().message()));
    }
  }
  return d;
}

Daemon::Daemon(const DaemonConfig& config)
    : config_(config), fd_socket_path_(config.socket + ".fds") {}

Daemon::~Daemon() { Shutdown(); }

absl::Status Daemon::Start() {
  registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<Metrics>(registry_);
  if (config_.metrics_address != "off" && !config_.metrics_address.empty()) {
    collector_ = std::make_shared<PoolCollector>(pool_.get(), config_.check_invariants_on_scrape,
                                                 config_.metrics_agent_names);
    auto render = [registry = registry_, collector = collector_] {
      std::vector<prometheus::MetricFamily> families = registry->Collect();
      std::vector<prometheus::MetricFamily> state = collector->Collect();
      families.insert(families.end(), std::make_move_iterator(state.begin()),
                      std::make_move_iterator(state.end()));
      return prometheus::TextSerializer().Serialize(families);
    };
    // Ready (GET /readyz) once Start has finished, until a drain or shutdown.
    auto ready = [this]() -> absl::Status {
      if (!serving_.load() || shut_down_.load()) return absl::UnavailableError("not serving");
      if (pool_->draining()) return absl::UnavailableError("draining");
      return absl::OkStatus();
    };
    auto server = MetricsHttpServer::Start({.address = config_.metrics_address}, std::move(render),
                                           std::move(ready));
    if (!server.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          server.status().message(),
          " (is another polykvd running? use --metrics-address HOST:PORT or 'off')"));
    }
    metrics_server_ = *std::move(server);
    std::vector<std::string> host_port = absl::StrSplit(config_.metrics_address, ':');
    metrics_address_ = absl::StrCat(host_port.empty() ? "127.0.0.1" : host_port[0], ":",
                                    metrics_server_->port());
  }

  peers_ = std::make_unique<PeerRegistry>();
  watches_ = std::make_unique<WatchQuota>(config_.max_watch_streams_per_uid);
  // Enough for a node's normal churn; a loop of opens and closes is counted.
  session_log_ = std::make_unique<LogThrottle>(
      LogThrottle::Options{.period = absl::Seconds(10), .lines_per_period = 20});
  ServiceContext ctx;
  ctx.pool = pool_.get();
  ctx.watches = watches_.get();
  ctx.session_log = session_log_.get();
  ctx.peers = peers_.get();
  ctx.metrics = metrics_.get();
  errors_ = std::make_unique<ErrorLog>(ErrorLog::Options{.logger = DaemonLogger()});
  ctx.errors = errors_.get();
  ctx.admin_uids = OrDefaultUids(config_.admin_uids);
  ctx.fd_socket_path = fd_socket_path_;
  ctx.metrics_address = metrics_address_;
  std::optional<PeerTls> peer_tls;
  if (config_.peer.tls()) {
    auto tls = LoadPeerTls(config_.peer.cert, config_.peer.key, config_.peer.ca);
    if (!tls.ok()) return tls.status();
    peer_tls = *std::move(tls);
    mover_ = std::make_unique<SessionMover>(pool_.get(), *peer_tls);
    ctx.mover = mover_.get();
  }
  session_service_ = std::make_unique<SessionService>(ctx);
  admin_service_ = std::make_unique<AdminService>(ctx);
  prefix_service_ = std::make_unique<PrefixService>(ctx);

  RouteProtobufLogs();
  grpc::ServerBuilder builder;
  builder.RegisterService(session_service_.get());
  builder.RegisterService(admin_service_.get());
  builder.RegisterService(prefix_service_.get());
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.SetMaxReceiveMessageSize(1 << 20);
  if (config_.connection_idle_ms > 0) {
    // Applies to the connections we hand over with AddInsecureChannelFromFd
    // too (they get the server's channel args): rpc_findings_test's
    // Finding4_IdleConnectionsAreClosedAfterTheTimeout checks it.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(config_.connection_idle_ms));
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<ParseErrorInterceptorFactory>(metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (!server_) return absl::InternalError("gRPC server failed to start");

  if (!config_.peer.address.empty()) {
    // Another polykvd moving a session here: TCP, mutual TLS only.
    peer_service_ = std::make_unique<PeerService>(ctx, config_.socket);
    grpc::ServerBuilder pb;
    pb.RegisterService(peer_service_.get());
    pb.SetMaxReceiveMessageSize(kMaxPeerMessageBytes);
    int port = 0;
    pb.AddListeningPort(config_.peer.address, PeerServerCredentials(*peer_tls), &port);
    peer_server_ = pb.BuildAndStart();
    if (!peer_server_ || port == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot listen for peers on ", config_.peer.address));
    }
    const std::string host = config_.peer.address.substr(0, config_.peer.address.rfind(':'));
    peer_address_ = absl::StrCat(host, ":", port);
  }

  PeerPolicy policy;
  const std::set<uid_t> uids = OrDefaultUids(config_.allowed_uids);
  policy.allowed_uids = uids;
  policy.allowed_gids = {config_.allowed_gids.begin(), config_.allowed_gids.end()};

  if (auto dir = config_.socket.substr(0, config_.socket.rfind('/')); !dir.empty() &&
      config_.socket.find('/') != std::string::npos) {
    // The socket's folder: created if missing, never loosened if present.
    if (access(dir.c_str(), F_OK) != 0 && mkdir(dir.c_str(), 0750) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create socket folder ", dir));
    }
  }
  listener_log_ = std::make_unique<LogThrottle>(LogThrottle::Options{.period = absl::Seconds(10)});
  FdBrokerOptions bo;
  bo.path = fd_socket_path_;
  bo.mode = config_.socket_mode;
  bo.policy = policy;
  bo.pool = pool_.get();
  bo.on_reject = [this](const PeerCreds& p) {
    metrics_->PeerRejected("fd");
    if (auto skipped = listener_log_->Admit("fd_not_allowed")) {
      DaemonLogger()->warn("fd socket: refused peer pid={} uid={} gid={} (not in allowed_uids/"
                           "allowed_gids); {} more refused since the last line",
                           p.pid, p.uid, p.gid, *skipped);
    }
  };
  auto broker = FdBroker::Create(bo);
  if (!broker.ok()) return broker.status();
  fd_broker_ = *std::move(broker);

  RaiseFdLimit();
  UdsListenerOptions lo;
  lo.path = config_.socket;
  lo.mode = config_.socket_mode;
  lo.policy = policy;
  lo.limits = {.max_connections = config_.max_connections,
               .max_connections_per_uid = config_.max_connections_per_uid};
  lo.on_accept = [this](const Connection& c) { OnAccept(c); };
  lo.on_close = [this](const Connection& c) { OnClose(c); };
  lo.on_reject = [this](const PeerCreds& p, RejectReason why) { OnReject(p, why); };
  lo.on_accept_error = [this](int error) { OnAcceptError(error); };
  auto listener = UdsListener::Create(lo);
  if (!listener.ok()) return listener.status();
  listener_ = *std::move(listener);

  fd_broker_->Start();
  listener_->Start();
  reaper_ = std::thread([this] { ReaperLoop(); });
  ladder_ = std::thread([this] { LadderLoop(); });
  serving_ = true;
  DaemonLogger()->info("polykvd {} listening on {} (fds {}), tier {}, pool {} bytes, lease {} ms, metrics {}, peers {}",
               POLYKV_VERSION, config_.socket, fd_socket_path_, config_.tier, config_.pool_bytes,
               config_.lease_ms, metrics_address_.empty() ? "off" : metrics_address_,
               peer_address_.empty() ? "off" : peer_address_);
  return absl::OkStatus();
}

void Daemon::OnAccept(const Connection& c) {
  // Registered before gRPC sees the fd: its first RPC finds the entry.
  peers_->Add(c.fd, c.id, c.peer);
  metrics_->SetGrpcConnections(listener_->num_connections());
  grpc::AddInsecureChannelFromFd(server_.get(), c.fd);
}

void Daemon::OnClose(const Connection& c) {
  peers_->Remove(c.fd, c.id);
  metrics_->SetGrpcConnections(listener_->num_connections());
}

void Daemon::OnReject(const PeerCreds& p, RejectReason why) {
  const char* reason = RejectReasonName(why);
  if (why == RejectReason::kNotAllowed) {
    metrics_->PeerRejected("grpc");
  } else {
    metrics_->ConnectionRefused(reason);
  }
  auto skipped = listener_log_->Admit(reason);
  if (!skipped) return;
  if (why == RejectReason::kNotAllowed) {
    DaemonLogger()->warn("socket: refused peer pid={} uid={} gid={} (not in allowed_uids/allowed_gids); "
                         "{} more refused for this reason since the last line",
                         p.pid, p.uid, p.gid, *skipped);
    return;
  }
  DaemonLogger()->warn("socket: refused a connection of pid={} uid={}: {} reached ({} open, limits "
                       "{} in all, {} per uid; raise them in the config); {} more refused for this "
                       "reason since the last line",
                       p.pid, p.uid, reason, listener_->num_connections(), config_.max_connections,
                       config_.max_connections_per_uid, *skipped);
}

void Daemon::OnAcceptError(int error) {
  metrics_->AcceptBackoff();
  if (auto skipped = listener_log_->Admit("accept_error")) {
    DaemonLogger()->warn("socket: accept failed: {}; new connections wait in the backlog until fds "
                         "free up (RLIMIT_NOFILE, max_connections); {} more since the last line",
                         std::strerror(error), *skipped);
  }
}

void Daemon::RaiseFdLimit() {
  // Room for the gRPC connections plus arenas, the fd socket, gRPC's own fds.
  constexpr rlim_t kHeadroom = 512;
  const rlim_t wanted = rlim_t{config_.max_connections} + kHeadroom;
  rlimit lim{};
  if (config_.max_connections == 0 || getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= wanted) {
    return;
  }
  const rlim_t soft = std::min(wanted, lim.rlim_max);
  rlimit raised{soft, lim.rlim_max};
  if (soft > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0) lim.rlim_cur = soft;
  if (lim.rlim_cur < wanted) {
    DaemonLogger()->warn("RLIMIT_NOFILE is {} (hard {}), below max_connections {} + {}: past it, new "
                         "connections wait (raise LimitNOFILE or lower max_connections)",
                         lim.rlim_cur, lim.rlim_max, config_.max_connections, kHeadroom);
  }
}

size_t Daemon::num_connections() const { return listener_->num_connections(); }
size_t Daemon::num_registered_peers() const { return peers_->size(); }

void Daemon::ReaperLoop() {
  // A quarter lease between sweeps: a dead worker's pages are back within
  // 1.25 lease periods of its last heartbeat.
  const absl::Duration period = absl::Milliseconds(std::max<uint32_t>(config_.lease_ms / 4, 20));
  while (!stop_reaper_.WaitForNotificationWithTimeout(period)) {
    if (const uint32_t n = pool_->OffloadIdle(); n > 0) {
      DaemonLogger()->debug("offloaded {} idle sessions", n);
    }
    for (const KvPool::Reclaimed& r : pool_->ReclaimExpired()) {
      metrics_->SessionReclaimed(r.reason);
      auto skipped = session_log_->Admit(absl::StrCat("reclaim:", r.reason));
      if (!skipped) continue;
      DaemonLogger()->info("reclaimed session {} ({}){}", r.session_id,
                           std::string_view(r.reason) == "lease" ? "lease expired"
                                                                 : "drain deadline passed",
                           *skipped == 0 ? "" : absl::StrCat("; ", *skipped, " more not logged "
                                                             "before this one"));
    }
  }
}

void Daemon::LadderLoop() {
  // The ladder only marks sessions and flips a flag; the compaction itself
  // runs at each session's next Sync (the worker's step boundary).
  const absl::Duration period = absl::Milliseconds(50);
  while (!stop_reaper_.WaitForNotificationWithTimeout(period)) {
    for (const std::string& step : pool_->RunPressureLadder()) {
      DaemonLogger()->info("pressure ladder: {} ({} bytes used, {} pending ack)", step,
                           pool_->used_bytes(), pool_->pending_bytes());
    }
    for (const std::string& error : pool_->TakeCompactionErrors()) {
      if (auto skipped = session_log_->Admit("compaction_failed")) {
        DaemonLogger()->warn("compaction failed: {} (the session keeps its tables){}", error,
                             *skipped == 0 ? "" : absl::StrCat("; ", *skipped, " more not logged"));
      }
    }
  }
}

void Daemon::Drain(absl::Duration timeout) {
  const uint32_t open = pool_->Drain(timeout);
  DaemonLogger()->info("draining: {} sessions open; evicting what is left after {} ms", open,
               absl::ToInt64Milliseconds(timeout));
  const absl::Time deadline = absl::Now() + timeout + absl::Seconds(1);
  while (pool_->num_sessions() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  DaemonLogger()->info("drained: {} sessions left, {} bytes in use", pool_->num_sessions(),
               pool_->used_bytes());
}

void Daemon::Shutdown() {
  if (shut_down_.exchange(true)) return;
  if (listener_) listener_->Stop();
  if (fd_broker_) fd_broker_->Stop();
  // Watch streams run until their channel closes or the call is cancelled;
  // closing them first lets the server stop at once instead of waiting out
  // its deadline (a restart under the gRPC fuzzer spent most of its time there).
  if (pool_) pool_->CloseEventStreams();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (peer_server_) {
    peer_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (reaper_.joinable() || ladder_.joinable()) {
    if (!stop_reaper_.HasBeenNotified()) stop_reaper_.Notify();  // stops both loops
    if (reaper_.joinable()) reaper_.join();
    if (ladder_.joinable()) ladder_.join();
  }
  listener_.reset();
  fd_broker_.reset();
  server_.reset();
  peer_server_.reset();
  metrics_server_.reset();
}

}  // namespace polykv::daemon
