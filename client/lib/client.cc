#include "polykv/client.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/lib/arena_mapper.h"
#include "client/lib/channel.h"
#include "kernels/device.h"
#include "polykv/v1/session.grpc.pb.h"

namespace polykv {
namespace {

using internal::FromGrpc;
using internal::SetDeadline;

// Values of kernels::PageFormat equal proto PageFormat's (static_asserts in
// daemon/rpc/convert.cc). A value this build does not know comes from a newer
// daemon; the pages cannot be read without knowing their format.
absl::StatusOr<PageFormat> FormatFromWire(int value, absl::string_view what) {
  if (!kernels::IsValidFormat(value)) {
    return absl::InternalError(
        absl::StrCat("polykvd sent ", what, " page format ", value, ", unknown to this client"));
  }
  return static_cast<PageFormat>(value);
}

// Open's and Sync's wanted streams. A stream this build does not know comes
// from a newer daemon: it is not asked for, since this worker cannot
// measure it.
template <typename Response>
WantedStreams WantedFromWire(const Response& resp) {
  WantedStreams w;
  for (int s : resp.wanted_streams()) {
    if (const auto stream = policies::FromWireValue(s)) w.streams.add(*stream);
  }
  w.per_layer = resp.wants_per_layer();
  // 0 is unset: a daemon that does not decay.
  const float decay = resp.attention_decay();
  w.attention_decay = decay > 0.f && decay <= 1.f ? decay : 1.f;
  return w;
}

v1::PageFormat FormatToWire(std::optional<PageFormat> f) {
  return f ? static_cast<v1::PageFormat>(*f) : v1::PAGE_FORMAT_UNSPECIFIED;
}

// The arena kinds to ask for (OpenSessionRequest.can_map). Device arenas
// only where this process can map them: a CUDA build on a node with a GPU.
absl::StatusOr<std::vector<v1::ArenaHandle::Kind>> CanMap(PageMemory where) {
  const bool device = kernels::CudaDeviceCount() > 0;
  switch (where) {
    case PageMemory::kHost:
      return std::vector{v1::ArenaHandle::KIND_HOST_SHM};
    case PageMemory::kDevice:
      if (!device) {
        return absl::FailedPreconditionError(
            kernels::CudaBuilt() ? "pages on the device asked for, and no CUDA device is visible"
                                 : "pages on the device asked for, and libpolykv_client was "
                                   "built without CUDA");
      }
      return std::vector{v1::ArenaHandle::KIND_CUDA_VMM, v1::ArenaHandle::KIND_CUDA_IPC};
    case PageMemory::kEither:
      if (!device) return std::vector{v1::ArenaHandle::KIND_HOST_SHM};
      return std::vector{v1::ArenaHandle::KIND_HOST_SHM, v1::ArenaHandle::KIND_CUDA_VMM,
                         v1::ArenaHandle::KIND_CUDA_IPC};
  }
  return absl::InvalidArgumentError("unknown SessionOptions::page_memory");
}

void FillRef(const SessionRef& r, v1::SessionRef* out) {
  out->set_session_id(r.session_id);
  out->set_token(r.token);
}

class SessionImpl final : public Session {
 public:
  SessionImpl(std::shared_ptr<v1::Session::Stub> stub, SessionInfo info, SessionRef ref,
              const std::string& fd_socket_path)
      : stub_(std::move(stub)),
        info_(info),
        ref_(std::move(ref)),
        mapper_(std::make_unique<internal::ArenaMapper>(fd_socket_path, ref_)) {}

  ~SessionImpl() override { (void)Close(); }

  absl::Status Init(const v1::OpenSessionResponse& resp, bool heartbeat) {
    for (const auto& a : resp.arenas()) {
      if (auto s = mapper_->Add(a); !s.ok()) return s;
    }
    epoch_ = resp.epoch();
    heartbeat_on_ = heartbeat;
    if (heartbeat) heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    return absl::OkStatus();
  }

  const SessionInfo& info() const override { return info_; }
  const std::vector<Block>& blocks() const override { return blocks_; }
  uint64_t reserved_tokens() const override { return blocks_.size() * info_.block_tokens; }
  uint64_t epoch() const override { return epoch_; }
  const std::string& token() const override { return ref_.token; }
  uint64_t moves() const override { return moves_; }
  bool same_slots() const override { return same_slots_; }

  absl::StatusOr<std::vector<Block>> Reserve(uint64_t num_tokens) override {
    if (auto s = CheckActive(); !s.ok()) return s;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::ReserveRequest req;
    FillRef(ref_, req.mutable_session());
    req.set_num_tokens(num_tokens);
    v1::ReserveResponse resp;
    if (auto s = FromGrpc(stub_->Reserve(&ctx, req, &resp)); !s.ok()) return s;
    for (const auto& a : resp.new_arenas()) {
      if (auto s = mapper_->Add(a); !s.ok()) return s;
    }
    std::vector<Block> out;
    for (const auto& b : resp.blocks()) {
      auto block = Convert(b);
      if (!block.ok()) return block.status();
      out.push_back(*block);
      blocks_.push_back(*std::move(block));
    }
    return out;
  }

  absl::StatusOr<uint64_t> SharePrefix(std::span<const int32_t> token_ids) override {
    if (auto s = CheckActive(); !s.ok()) return s;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::SharePrefixRequest req;
    FillRef(ref_, req.mutable_session());
    req.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
    v1::SharePrefixResponse resp;
    if (auto s = FromGrpc(stub_->SharePrefix(&ctx, req, &resp)); !s.ok()) return s;
    return resp.shared_tokens();
  }

  absl::StatusOr<uint64_t> AttachPrefix(std::span<const int32_t> token_ids) override {
    if (auto s = CheckActive(); !s.ok()) return s;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::AttachPrefixRequest req;
    FillRef(ref_, req.mutable_session());
    req.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
    v1::AttachPrefixResponse resp;
    if (auto s = FromGrpc(stub_->AttachPrefix(&ctx, req, &resp)); !s.ok()) return s;
    for (const auto& a : resp.new_arenas()) {
      if (auto s = mapper_->Add(a); !s.ok()) return s;
    }
    for (const auto& b : resp.blocks()) {
      auto block = Convert(b);
      if (!block.ok()) return block.status();
      blocks_.push_back(*std::move(block));
    }
    committed_ = resp.attached_tokens();
    return committed_;
  }

  absl::Status Commit(uint64_t committed_tokens) override {
    if (auto s = CheckActive(); !s.ok()) return s;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::CommitRequest req;
    FillRef(ref_, req.mutable_session());
    req.set_committed_tokens(committed_tokens);
    v1::CommitResponse resp;
    if (auto s = FromGrpc(stub_->Commit(&ctx, req, &resp)); !s.ok()) return s;
    committed_ = committed_tokens;
    return absl::OkStatus();
  }

  uint64_t committed_tokens() const override { return committed_; }
  const std::vector<int64_t>& slot_positions() const override { return slot_positions_; }
  const std::vector<int64_t>& layer_slot_positions() const override {
    return layer_slot_positions_;
  }
  const std::vector<uint32_t>& slot_counts() const override { return slot_counts_; }

  absl::Status ReportSlots(uint64_t first_slot, const std::vector<SlotMeta>& meta,
                           const std::vector<ScoreValues>& scores,
                           uint32_t current_turn) override {
    if (auto s = CheckActive(); !s.ok()) return s;
    v1::ReportSlotsRequest req;
    req.set_current_turn(current_turn);
    for (const SlotMeta& m : meta) {
      auto* p = req.add_slots();
      // A negative turn wraps past INT32_MAX: the daemon refuses it.
      p->set_turn(static_cast<uint32_t>(m.turn));
      p->set_role(static_cast<v1::Role>(m.role));
      p->set_tag_kind(static_cast<v1::BlockKind>(m.tag.kind));
      p->set_block_id(m.tag.block_id);
      p->set_tag_depth(m.tag.depth);
      p->set_tag_boundary(m.tag.boundary);
      p->set_pinned(m.pinned);
    }
    for (const ScoreValues& v : scores) {
      auto* p = req.add_scores();
      p->set_stream(static_cast<v1::ScoreStream>(policies::WireValue(v.stream)));
      p->set_per_layer(v.per_layer);
      p->mutable_values()->Add(v.values.begin(), v.values.end());
    }
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    FillRef(ref_, req.mutable_session());
    req.set_epoch(epoch_);
    req.set_first_slot(first_slot);
    v1::ReportSlotsResponse resp;
    return FromGrpc(stub_->ReportSlots(&ctx, req, &resp));
  }

  absl::Status Idle() override {
    if (auto s = CheckActive(); !s.ok()) return s;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::SyncRequest req;
    FillRef(ref_, req.mutable_session());
    req.set_known_epoch(epoch_);
    req.set_then_idle(true);
    v1::SyncResponse resp;
    if (auto s = FromGrpc(stub_->Sync(&ctx, req, &resp)); !s.ok()) return s;
    // Whatever it says (a move that parks it, tables published meanwhile),
    // the next Sync takes it up.
    idle_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Sync() override {
    if (closed_) return absl::FailedPreconditionError("session is closed");
    idle_ = false;
    same_slots_ = false;
    v1::SyncResponse resp;
    for (;;) {
      resp.Clear();
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      v1::SyncRequest req;
      FillRef(ref_, req.mutable_session());
      req.set_known_epoch(epoch_);
      if (auto s = FromGrpc(stub_->Sync(&ctx, req, &resp)); !s.ok()) return s;
      if (resp.has_moved_to()) return FollowMove(resp.moved_to());
      // Parked for a move: write nothing, ask again until it is over (the
      // daemon bounds the move; it ends here or moves on).
      if (!resp.parked()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (const auto& a : resp.new_arenas()) {
      if (auto s = mapper_->Add(a); !s.ok()) return s;
    }
    // The agent's QoS may have changed since Open: the streams follow it.
    info_.wants = WantedFromWire(resp);
    if (!resp.changed()) return false;
    std::vector<Block> blocks;
    for (const auto& b : resp.blocks()) {
      auto block = Convert(b);
      if (!block.ok()) return block.status();
      blocks.push_back(*std::move(block));
    }
    blocks_ = std::move(blocks);
    same_slots_ = resp.same_slots();
    epoch_ = resp.epoch();
    committed_ = resp.committed_tokens();
    slot_positions_.assign(resp.slot_positions().begin(), resp.slot_positions().end());
    slot_counts_.assign(resp.slot_counts().begin(), resp.slot_counts().end());
    layer_slot_positions_.assign(resp.layer_slot_positions().begin(),
                                 resp.layer_slot_positions().end());
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::AckRequest ack;
    FillRef(ref_, ack.mutable_session());
    ack.set_epoch(epoch_);
    v1::AckResponse ack_resp;
    if (auto s = FromGrpc(stub_->Ack(&ctx, ack, &ack_resp)); !s.ok()) return s;
    return true;
  }

  absl::Status Release(uint64_t keep_tokens) override {
    if (auto s = CheckActive(); !s.ok()) return s;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::ReleaseRequest req;
    FillRef(ref_, req.mutable_session());
    req.set_keep_tokens(keep_tokens);
    v1::ReleaseResponse resp;
    if (auto s = FromGrpc(stub_->Release(&ctx, req, &resp)); !s.ok()) return s;
    const uint64_t keep_blocks = resp.reserved_tokens() / info_.block_tokens;
    if (blocks_.size() > keep_blocks) blocks_.resize(keep_blocks);
    committed_ = resp.committed_tokens();
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    closed_ = true;
    StopHeartbeat();
    grpc::ClientContext ctx;
    SetDeadline(&ctx, 5000);
    v1::CloseSessionRequest req;
    FillRef(ref_, req.mutable_session());
    v1::CloseSessionResponse resp;
    return FromGrpc(stub_->CloseSession(&ctx, req, &resp));
  }

 private:
  absl::StatusOr<Block> Convert(const v1::Block& b) const { return Convert(b, *mapper_); }
  // `b` with its pages' addresses in `mapper`'s arenas.
  absl::StatusOr<Block> Convert(const v1::Block& b, const internal::ArenaMapper& mapper) const {
    // By layer: the daemon lists only the layers the block holds.
    const size_t entries = 2 * size_t(info_.num_layers);
    Block out;
    out.block_index = b.block_index();
    out.pages.resize(entries);
    for (size_t i = 0; i < entries; ++i) {
      out.pages[i].layer = static_cast<uint32_t>(i / 2);
      out.pages[i].is_value = i % 2 == 1;
    }
    std::vector<bool> seen(entries, false);
    for (const auto& p : b.pages()) {
      const size_t i = 2 * size_t(p.layer()) + (p.is_value() ? 1 : 0);
      if (i >= entries || seen[i]) {
        return absl::InternalError(absl::StrCat("polykvd sent block ", b.block_index(),
                                                " a page of layer ", p.layer(), " for ",
                                                info_.num_layers, " layers, or twice"));
      }
      seen[i] = true;
      auto addr = mapper.Address(p.arena_id(), p.offset(), p.size_bytes());
      if (!addr.ok()) return addr.status();
      auto format = FormatFromWire(p.format(), "a");
      if (!format.ok()) return format.status();
      out.pages[i] = Page{p.page_id(), p.arena_id(), p.offset(),   p.size_bytes(),
                          p.layer(),   p.is_value(), *format,      *addr,
                          info_.pages_on_device};
    }
    for (size_t l = 0; l < info_.num_layers; ++l) {
      if (seen[2 * l] != seen[2 * l + 1]) {
        return absl::InternalError(absl::StrCat("polykvd sent block ", b.block_index(),
                                                " only half of layer ", l, "'s pages"));
      }
    }
    return out;
  }

  absl::Status CheckActive() const {
    if (closed_) return absl::FailedPreconditionError("session is closed");
    if (idle_) {
      return absl::FailedPreconditionError(
          "the session is idle (Idle): Sync first, it may have moved meanwhile");
    }
    return absl::OkStatus();
  }

  // The session moved to another polykvd: attach there, map its arenas and
  // take its tables (the same slots at the same epoch, in new pages), then
  // Sync there, the step boundary this call is. True: the tables changed
  // (their pages at least; their slots too when that Sync published an epoch).
  absl::StatusOr<bool> FollowMove(const v1::MovedTo& to) {
    auto channel = internal::Dial(to.socket_path(), 5000);
    if (!channel.ok()) {
      return absl::UnavailableError(absl::StrCat("the session moved to the polykvd at ",
                                                 to.socket_path(), ", which does not answer: ",
                                                 channel.status().message()));
    }
    auto stub = std::shared_ptr<v1::Session::Stub>(v1::Session::NewStub(*channel));
    const SessionRef ref{to.session().session_id(), to.session().token()};
    v1::OpenSessionResponse resp;
    {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      v1::AttachSessionRequest req;
      FillRef(ref, req.mutable_session());
      if (auto s = FromGrpc(stub->AttachSession(&ctx, req, &resp)); !s.ok()) return s;
    }
    if (resp.block_tokens() != info_.block_tokens || resp.epoch() != epoch_ ||
        static_cast<size_t>(resp.blocks_size()) != blocks_.size()) {
      return absl::InternalError(absl::StrCat(
          "the moved session is not the one this worker holds: ", resp.blocks_size(),
          " blocks of ", resp.block_tokens(), " tokens at epoch ", resp.epoch(), ", not ",
          blocks_.size(), " of ", info_.block_tokens, " at ", epoch_));
    }
    auto mapper = std::make_unique<internal::ArenaMapper>(resp.fd_socket_path(), ref);
    for (const auto& a : resp.arenas()) {
      if (auto s = mapper->Add(a); !s.ok()) return s;
    }
    std::vector<Block> blocks;
    for (const auto& b : resp.blocks()) {
      auto block = Convert(b, *mapper);
      if (!block.ok()) return block.status();
      blocks.push_back(*std::move(block));
    }
    StopHeartbeat();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stub_ = std::move(stub);
      ref_ = ref;
    }
    // The old daemon's arenas are unmapped here: nothing reads them past
    // this step boundary (the caller adopts the tables returned below).
    mapper_ = std::move(mapper);
    blocks_ = std::move(blocks);
    info_.session_id = ref.session_id;
    info_.lease_ms = resp.lease_ms();
    ++moves_;
    if (heartbeat_on_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = false;
      }
      heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    }
    auto changed = Sync();
    if (!changed.ok()) return changed.status();
    return true;
  }

  void StopHeartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  void HeartbeatLoop() {
    // Three beats per lease: one lost or slow beat does not cost the session.
    const auto period = std::chrono::milliseconds(std::max<uint32_t>(info_.lease_ms / 3, 10));
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
      // A move swaps these (FollowMove), under the lock.
      const std::shared_ptr<v1::Session::Stub> stub = stub_;
      v1::HeartbeatRequest req;
      FillRef(ref_, req.mutable_session());
      lock.unlock();
      grpc::ClientContext ctx;
      SetDeadline(&ctx, static_cast<int>(info_.lease_ms));
      v1::HeartbeatResponse resp;
      grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
      lock.lock();
      // The session is gone (closed, evicted, or moved: Sync follows it
      // and beats anew there).
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) break;
    }
  }

  // The daemon the session lives at, and the session there: a move
  // (FollowMove) replaces them, stub_ and ref_ under mu_ (the heartbeat
  // thread reads them).
  std::shared_ptr<v1::Session::Stub> stub_;
  SessionInfo info_;  // const but for the wanted streams (Sync) and a move's id and lease
  SessionRef ref_;
  std::unique_ptr<internal::ArenaMapper> mapper_;
  uint64_t moves_ = 0;
  bool heartbeat_on_ = false;
  bool idle_ = false;  // Idle() until the next Sync
  bool same_slots_ = false;  // of the last Sync that changed the tables
  std::vector<Block> blocks_;
  uint64_t epoch_ = 0;
  uint64_t committed_ = 0;
  std::vector<int64_t> slot_positions_;
  std::vector<int64_t> layer_slot_positions_;
  std::vector<uint32_t> slot_counts_;
  bool closed_ = false;

  std::mutex mu_;  // guards stop_, and stub_ and ref_ against the heartbeat thread
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

class ClientImpl final : public Client {
 public:
  explicit ClientImpl(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::Session::NewStub(channel)) {}

  absl::StatusOr<std::unique_ptr<Session>> OpenSession(const SessionOptions& o) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::OpenSessionRequest req;
    req.set_agent_id(o.agent_id);
    req.set_tenant(o.tenant);
    auto* p = req.mutable_profile();
    p->set_num_layers(o.profile.num_layers);
    p->set_num_kv_heads(o.profile.num_kv_heads);
    p->set_head_dim(o.profile.head_dim);
    p->set_dtype(static_cast<v1::DType>(o.profile.dtype));
    p->set_model_id(o.profile.model_id);
    req.set_key_format(FormatToWire(o.key_format));
    req.set_value_format(FormatToWire(o.value_format));
    req.set_block_tokens(o.block_tokens);
    req.set_lease_ms(o.lease_ms);
    auto can_map = CanMap(o.page_memory);
    if (!can_map.ok()) return can_map.status();
    for (v1::ArenaHandle::Kind k : *can_map) req.add_can_map(k);
    v1::OpenSessionResponse resp;
    if (auto s = FromGrpc(stub_->OpenSession(&ctx, req, &resp)); !s.ok()) return s;
    SessionInfo info;
    info.session_id = resp.session_id();
    info.num_layers = o.profile.num_layers;
    info.block_tokens = resp.block_tokens();
    info.lease_ms = resp.lease_ms();
    const auto kf = FormatFromWire(resp.key_format(), "the key");
    const auto vf = FormatFromWire(resp.value_format(), "the value");
    info.key_format = kf.value_or(PageFormat::kF16);
    info.value_format = vf.value_or(PageFormat::kF16);
    info.key_page_bytes = resp.key_page_bytes();
    info.value_page_bytes = resp.value_page_bytes();
    info.wants = WantedFromWire(resp);
    info.pages_on_device = resp.arena_kind() == v1::ArenaHandle::KIND_CUDA_VMM ||
                           resp.arena_kind() == v1::ArenaHandle::KIND_CUDA_IPC;
    info.cuda_device = info.pages_on_device ? resp.cuda_device() : -1;
    auto session = std::make_unique<SessionImpl>(
        stub_, info, SessionRef{resp.session_id(), resp.token()}, resp.fd_socket_path());
    // Checked once the session exists, so that its destructor closes it.
    if (!kf.ok()) return kf.status();
    if (!vf.ok()) return vf.status();
    if (auto s = session->Init(resp, o.heartbeat); !s.ok()) return s;
    return std::unique_ptr<Session>(std::move(session));
  }

 private:
  std::shared_ptr<v1::Session::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path,
                                                        int timeout_ms) {
  auto channel = internal::Dial(socket_path, timeout_ms);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<Client>(new ClientImpl(*channel));
}

absl::StatusOr<uint64_t> ReserveRaw(const std::string& socket_path, const SessionRef& ref,
                                    uint64_t num_tokens) {
  auto channel = internal::Dial(socket_path, 5000);
  if (!channel.ok()) return channel.status();
  auto stub = v1::Session::NewStub(*channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ReserveRequest req;
  FillRef(ref, req.mutable_session());
  req.set_num_tokens(num_tokens);
  v1::ReserveResponse resp;
  if (auto s = FromGrpc(stub->Reserve(&ctx, req, &resp)); !s.ok()) return s;
  return resp.reserved_tokens();
}

}  // namespace polykv
