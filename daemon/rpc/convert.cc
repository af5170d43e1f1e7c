#include "daemon/rpc/convert.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "daemon/compaction/policy_registry.h"
#include "policies/session_view.h"

namespace polykv::daemon {
namespace {

// Every proto enum value equals the internal value of the same name, so the
// translation below (and libpolykv_client's) is a cast plus a range check.
// The counts catch a value added on one side only.
static_assert(v1::PAGE_FORMAT_F32 == static_cast<int>(PageFormat::kF32));
static_assert(v1::PAGE_FORMAT_F16 == static_cast<int>(PageFormat::kF16));
static_assert(v1::PAGE_FORMAT_BF16 == static_cast<int>(PageFormat::kBF16));
static_assert(v1::PAGE_FORMAT_FP8_E4M3 == static_cast<int>(PageFormat::kFP8E4M3));
static_assert(v1::PAGE_FORMAT_INT8 == static_cast<int>(PageFormat::kInt8));
static_assert(v1::PAGE_FORMAT_INT4 == static_cast<int>(PageFormat::kInt4));
static_assert(v1::PAGE_FORMAT_INT2 == static_cast<int>(PageFormat::kInt2));
static_assert(v1::DTYPE_F32 == static_cast<int>(DType::kF32));
static_assert(v1::DTYPE_F16 == static_cast<int>(DType::kF16));
static_assert(v1::DTYPE_BF16 == static_cast<int>(DType::kBF16));
static_assert(v1::ROLE_SYSTEM == static_cast<int>(policies::Role::kSystem));
static_assert(v1::ROLE_USER == static_cast<int>(policies::Role::kUser));
static_assert(v1::ROLE_ASSISTANT == static_cast<int>(policies::Role::kAssistant));
static_assert(v1::ROLE_TOOL_CALL == static_cast<int>(policies::Role::kToolCall));
static_assert(v1::ROLE_TOOL_OUTPUT == static_cast<int>(policies::Role::kToolOutput));
static_assert(v1::ROLE_ERROR == static_cast<int>(policies::Role::kError));
static_assert(v1::BLOCK_KIND_NONE == static_cast<int>(policies::BlockKind::kNone));
static_assert(v1::BLOCK_KIND_TEXT == static_cast<int>(policies::BlockKind::kText));
static_assert(v1::BLOCK_KIND_IMPORT == static_cast<int>(policies::BlockKind::kImport));
static_assert(v1::BLOCK_KIND_SIGNATURE == static_cast<int>(policies::BlockKind::kSignature));
static_assert(v1::BLOCK_KIND_CLASS == static_cast<int>(policies::BlockKind::kClass));
static_assert(v1::BLOCK_KIND_BODY == static_cast<int>(policies::BlockKind::kBody));
static_assert(v1::BLOCK_KIND_COMMENT == static_cast<int>(policies::BlockKind::kComment));
static_assert(v1::BLOCK_KIND_STATEMENT == static_cast<int>(policies::BlockKind::kStatement));
static_assert(v1::BLOCK_KIND_TOOL_CALL == static_cast<int>(policies::BlockKind::kToolCall));
static_assert(v1::BLOCK_KIND_TOOL_OUTPUT == static_cast<int>(policies::BlockKind::kToolOutput));
static_assert(v1::BLOCK_KIND_ERROR == static_cast<int>(policies::BlockKind::kError));
static_assert(v1::PRIORITY_BEST_EFFORT == static_cast<int>(Priority::kBestEffort));
static_assert(v1::PRIORITY_LOW == static_cast<int>(Priority::kLow));
static_assert(v1::PRIORITY_NORMAL == static_cast<int>(Priority::kNormal));
static_assert(v1::PRIORITY_HIGH == static_cast<int>(Priority::kHigh));
static_assert(v1::PRIORITY_CRITICAL == static_cast<int>(Priority::kCritical));
static_assert(v1::SessionEvent::TYPE_EPOCH == static_cast<int>(SessionEventMsg::Type::kEpoch));
static_assert(v1::SessionEvent::TYPE_QOS == static_cast<int>(SessionEventMsg::Type::kQos));
static_assert(v1::SessionEvent::TYPE_DRAIN == static_cast<int>(SessionEventMsg::Type::kDrain));
static_assert(v1::SessionEvent::TYPE_EVICTED == static_cast<int>(SessionEventMsg::Type::kEvicted));
static_assert(v1::PageFormat_ARRAYSIZE == static_cast<int>(PageFormat::kInt2) + 1);
static_assert(v1::DType_ARRAYSIZE == static_cast<int>(DType::kBF16) + 1);
static_assert(v1::Role_ARRAYSIZE == policies::kNumRoles);
static_assert(v1::BlockKind_ARRAYSIZE == policies::kNumBlockKinds);
static_assert(v1::PriorityClass_ARRAYSIZE == static_cast<int>(Priority::kCritical) + 1);
static_assert(v1::SessionEvent::TYPE_MOVED == static_cast<int>(SessionEventMsg::Type::kMoved));
static_assert(v1::SessionEvent::Type_ARRAYSIZE ==
              static_cast<int>(SessionEventMsg::Type::kMoved) + 1);

}  // namespace

absl::StatusOr<std::optional<PageFormat>> FormatFromProto(int value, absl::string_view field) {
  if (value == v1::PAGE_FORMAT_UNSPECIFIED) return std::optional<PageFormat>();
  if (!kernels::IsValidFormat(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": unknown page format ", value));
  }
  return std::optional<PageFormat>(static_cast<PageFormat>(value));
}

v1::PageFormat FormatToProto(PageFormat f) { return static_cast<v1::PageFormat>(f); }
v1::PageFormat FormatToProto(const std::optional<PageFormat>& f) {
  return f ? FormatToProto(*f) : v1::PAGE_FORMAT_UNSPECIFIED;
}

absl::StatusOr<ModelProfile> FromProto(const v1::ModelProfile& p) {
  ModelProfile o;
  o.num_layers = p.num_layers();
  o.num_kv_heads = p.num_kv_heads();
  o.head_dim = p.head_dim();
  o.model_id = p.model_id();
  switch (p.dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_F16: o.dtype = DType::kF16; break;
    case v1::DTYPE_F32: o.dtype = DType::kF32; break;
    case v1::DTYPE_BF16: o.dtype = DType::kBF16; break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("profile.dtype: unknown dtype ", p.dtype()));
  }
  return o;
}

absl::StatusOr<PrefixSpaceRequest> FromProto(const v1::PrefixSpace& s, const PeerCreds& peer) {
  PrefixSpaceRequest o;
  o.tenant = s.tenant();
  auto profile = FromProto(s.profile());
  if (!profile.ok()) return profile.status();
  o.profile = *profile;
  auto kf = FormatFromProto(s.key_format(), "space.key_format");
  if (!kf.ok()) return kf.status();
  auto vf = FormatFromProto(s.value_format(), "space.value_format");
  if (!vf.ok()) return vf.status();
  o.key_format = *kf;
  o.value_format = *vf;
  o.block_tokens = s.block_tokens();
  o.peer = peer;
  return o;
}

absl::StatusOr<OpenRequest> FromProto(const v1::OpenSessionRequest& r, const PeerCreds& peer) {
  OpenRequest o;
  o.agent_id = r.agent_id();
  o.tenant = r.tenant();
  auto profile = FromProto(r.profile());
  if (!profile.ok()) return profile.status();
  o.profile = *profile;
  auto kf = FormatFromProto(r.key_format(), "key_format");
  if (!kf.ok()) return kf.status();
  auto vf = FormatFromProto(r.value_format(), "value_format");
  if (!vf.ok()) return vf.status();
  o.key_format = *kf;
  o.value_format = *vf;
  o.block_tokens = r.block_tokens();
  if (r.priority_hint() != v1::PRIORITY_UNSPECIFIED) {
    if (r.priority_hint() < v1::PRIORITY_BEST_EFFORT || r.priority_hint() > v1::PRIORITY_CRITICAL) {
      return absl::InvalidArgumentError(
          absl::StrCat("priority_hint: unknown class ", r.priority_hint()));
    }
    o.priority_hint = static_cast<Priority>(r.priority_hint());
  }
  o.lease_ms = r.lease_ms();
  o.peer = peer;
  for (int k : r.can_map()) {
    switch (k) {
      case v1::ArenaHandle::KIND_HOST_SHM: o.can_map.push_back(ArenaKind::kHostShm); break;
      case v1::ArenaHandle::KIND_CUDA_VMM: o.can_map.push_back(ArenaKind::kCudaVmm); break;
      case v1::ArenaHandle::KIND_CUDA_IPC: o.can_map.push_back(ArenaKind::kCudaIpc); break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("can_map: unknown arena kind ", k));
    }
  }
  return o;
}

absl::StatusOr<QosRecord> FromProto(const v1::QosRecord& q) {
  QosRecord o;
  o.agent_id = q.agent_id();
  if (q.priority() == v1::PRIORITY_UNSPECIFIED) {
    o.priority = Priority::kNormal;
  } else if (q.priority() >= v1::PRIORITY_BEST_EFFORT && q.priority() <= v1::PRIORITY_CRITICAL) {
    o.priority = static_cast<Priority>(q.priority());
  } else {
    return absl::InvalidArgumentError(absl::StrCat("qos.priority: unknown class ", q.priority()));
  }
  o.guaranteed_bytes = q.guaranteed_bytes();
  o.max_bytes = q.max_bytes();
  for (auto [value, field, out] :
       {std::tuple{q.key_precision_floor(), "qos.key_precision_floor", &o.key_floor},
        std::tuple{q.value_precision_floor(), "qos.value_precision_floor", &o.value_floor},
        std::tuple{q.key_format(), "qos.key_format", &o.key_format},
        std::tuple{q.value_format(), "qos.value_format", &o.value_format}}) {
    auto f = FormatFromProto(value, field);
    if (!f.ok()) return f.status();
    *out = *f;
  }
  o.block_tokens = q.block_tokens();
  o.policy = q.policy().empty() ? "full" : q.policy();
  o.budget_tokens = q.budget_tokens();
  o.budget_fraction = q.budget_fraction();
  o.uids.insert(q.uids().begin(), q.uids().end());
  return o;
}

// The wire's streams are policies::WireValue's, in the same order (each
// one's name and value: ConvertTest.EveryScoreStreamIsOnTheWireUnderItsName).
static_assert(v1::ScoreStream_ARRAYSIZE == policies::kNumScoreStreams + 1);

absl::StatusOr<policies::SlotMeta> FromProto(const v1::SlotMeta& m, absl::string_view where) {
  // Proto3 enums are open: numbers the enum does not name still arrive.
  if (m.role() < 0 || m.role() >= policies::kNumRoles || m.tag_kind() < 0 ||
      m.tag_kind() >= policies::kNumBlockKinds || m.turn() > uint32_t{INT32_MAX} ||
      m.tag_depth() > UINT16_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": role ", m.role(), " (0..", policies::kNumRoles - 1, "), tag_kind ",
        m.tag_kind(), " (0..", policies::kNumBlockKinds - 1, "), turn ", m.turn(), " (0..",
        INT32_MAX, ") or tag_depth ", m.tag_depth(), " (0..", UINT16_MAX, ") out of range"));
  }
  policies::SlotMeta s;
  s.turn = static_cast<int32_t>(m.turn());
  s.role = static_cast<policies::Role>(m.role());
  s.tag.kind = static_cast<policies::BlockKind>(m.tag_kind());
  s.tag.block_id = m.block_id();
  s.tag.depth = static_cast<uint16_t>(m.tag_depth());
  s.tag.boundary = m.tag_boundary();
  s.pinned = m.pinned();
  return s;
}

void ToProto(const policies::SlotMeta& in, v1::SlotMeta* out) {
  // A negative turn wraps past INT32_MAX: FromProto refuses it.
  out->set_turn(static_cast<uint32_t>(in.turn));
  out->set_role(static_cast<v1::Role>(in.role));
  out->set_tag_kind(static_cast<v1::BlockKind>(in.tag.kind));
  out->set_block_id(in.tag.block_id);
  out->set_tag_depth(in.tag.depth);
  out->set_tag_boundary(in.tag.boundary);
  out->set_pinned(in.pinned);
}

absl::StatusOr<ReportSlotsRequest> FromProto(const v1::ReportSlotsRequest& r) {
  ReportSlotsRequest o;
  o.epoch = r.epoch();
  o.first_slot = r.first_slot();
  o.current_turn = r.current_turn();
  o.slots.reserve(r.slots_size());
  for (int i = 0; i < r.slots_size(); ++i) {
    auto m = FromProto(r.slots(i), absl::StrCat("slots[", i, "] (slot ", r.first_slot() + i, ")"));
    if (!m.ok()) return m.status();
    o.slots.push_back(*m);
  }
  for (int i = 0; i < r.scores_size(); ++i) {
    const v1::ScoreValues& v = r.scores(i);
    const std::optional<policies::ScoreStream> stream = policies::FromWireValue(v.stream());
    if (!stream) {
      return absl::InvalidArgumentError(absl::StrCat("scores[", i, "]: stream ", v.stream(),
                                                     " unknown (1..", policies::kNumScoreStreams,
                                                     ")"));
    }
    policies::ScoreValues& s = o.scores.emplace_back();
    s.stream = *stream;
    s.per_layer = v.per_layer();
    s.values.assign(v.values().begin(), v.values().end());
  }
  return o;
}

void ToProto(const QosRecord& in, v1::QosRecord* out) {
  out->set_agent_id(in.agent_id);
  out->set_priority(static_cast<v1::PriorityClass>(in.priority));
  out->set_guaranteed_bytes(in.guaranteed_bytes);
  out->set_max_bytes(in.max_bytes);
  out->set_key_precision_floor(FormatToProto(in.key_floor));
  out->set_value_precision_floor(FormatToProto(in.value_floor));
  out->set_key_format(FormatToProto(in.key_format));
  out->set_value_format(FormatToProto(in.value_format));
  out->set_block_tokens(in.block_tokens);
  out->set_policy(in.policy);
  out->set_budget_tokens(in.budget_tokens);
  out->set_budget_fraction(in.budget_fraction);
  for (uid_t u : in.uids) out->add_uids(u);
  out->set_policy_note(PolicyNote(in.policy));
}

v1::ArenaHandle::Kind ToProto(ArenaKind kind) {
  switch (kind) {
    case ArenaKind::kHostShm: return v1::ArenaHandle::KIND_HOST_SHM;
    case ArenaKind::kCudaVmm: return v1::ArenaHandle::KIND_CUDA_VMM;
    case ArenaKind::kCudaIpc: return v1::ArenaHandle::KIND_CUDA_IPC;
  }
  return v1::ArenaHandle::KIND_UNSPECIFIED;
}

void ToProto(const ArenaExport& in, v1::ArenaHandle* out) {
  out->set_arena_id(in.arena_id);
  out->set_kind(ToProto(in.kind));
  out->set_size_bytes(in.size_bytes);
  if (!in.cuda_ipc_handle.empty()) out->set_cuda_ipc_handle(in.cuda_ipc_handle);
  out->set_cuda_device(in.cuda_device);
}

void ToProto(const BlockDesc& in, v1::Block* out) {
  out->set_block_index(in.block_index);
  for (const PageDesc& p : in.pages) {
    v1::PageDescriptor* d = out->add_pages();
    d->set_page_id(p.page_id);
    d->set_arena_id(p.arena_id);
    d->set_offset(p.offset);
    d->set_size_bytes(p.size_bytes);
    d->set_layer(p.layer);
    d->set_is_value(p.is_value);
    d->set_format(FormatToProto(p.format));
    d->set_block_index(p.block_index);
  }
}

void ToProto(const OpenResult& in, v1::OpenSessionResponse* out) {
  out->set_session_id(in.session_id);
  out->set_token(in.token);
  out->set_lease_ms(in.lease_ms);
  out->set_block_tokens(in.block_tokens);
  out->set_key_format(FormatToProto(in.key_format));
  out->set_value_format(FormatToProto(in.value_format));
  out->set_key_page_bytes(in.key_page_bytes);
  out->set_value_page_bytes(in.value_page_bytes);
  for (const auto& a : in.arenas) ToProto(a, out->add_arenas());
  out->set_arena_kind(ToProto(in.arena_kind));
  out->set_cuda_device(in.cuda_device);
  out->set_epoch(in.epoch);
  ToProto(in.qos, out->mutable_qos());
  SetWanted(in.wants, out);
  for (const auto& b : in.blocks) ToProto(b, out->add_blocks());
}

void ToProto(const ModelProfile& in, v1::ModelProfile* out) {
  out->set_num_layers(in.num_layers);
  out->set_num_kv_heads(in.num_kv_heads);
  out->set_head_dim(in.head_dim);
  out->set_dtype(static_cast<v1::DType>(in.dtype));
  out->set_model_id(in.model_id);
}

void ToProto(const SessionSummary& in, v1::SessionInfo* out) {
  out->set_session_id(in.session_id);
  out->set_agent_id(in.agent_id);
  out->set_tenant(in.tenant);
  out->set_priority(static_cast<v1::PriorityClass>(in.priority));
  out->set_reserved_tokens(in.reserved_tokens);
  out->set_committed_tokens(in.committed_tokens);
  out->set_bytes(in.bytes);
  out->set_epoch(in.epoch);
  out->set_key_format(FormatToProto(in.key_format));
  out->set_value_format(FormatToProto(in.value_format));
  out->set_peer_pid(static_cast<uint32_t>(in.peer.pid));
  out->set_peer_uid(in.peer.uid);
  out->set_idle_seconds(in.idle_seconds);
  ToProto(in.profile, out->mutable_profile());
  out->set_offloaded_to(in.offloaded_to);
}

void ToProto(const PoolSummary& in, v1::Stats* out) {
  v1::PoolStats* p = out->mutable_pool();
  p->set_tier(in.tier);
  p->set_pool_bytes(in.pool_bytes);
  p->set_arena_bytes(in.arena_bytes);
  p->set_used_bytes(in.used_bytes);
  p->set_free_bytes(in.pool_bytes - std::min(in.pool_bytes, in.used_bytes));
  p->set_num_arenas(in.num_arenas);
  p->set_num_pages(in.num_pages);
  p->set_superblock_bytes(in.superblock_bytes);
  p->set_num_superblocks_used(in.num_superblocks_used);
  for (const auto& t : in.tenants) {
    v1::TenantStats* ts = out->add_tenants();
    ts->set_tenant(t.tenant);
    ts->set_used_bytes(t.used_bytes);
    ts->set_arena_bytes(t.arena_bytes);
    ts->set_num_sessions(t.num_sessions);
  }
  out->set_num_sessions(in.num_sessions);
  out->set_draining(in.draining);
  out->set_lease_expiries(in.lease_expiries);
  out->set_refused_reservations(in.refused_reservations);
  v1::PrefixStats* prefix = out->mutable_prefix();
  prefix->set_shared_bytes(in.prefix_shared_bytes);
  prefix->set_cached_bytes(in.prefix_cached_bytes);
  prefix->set_hit_blocks(in.prefix_hit_blocks);
  prefix->set_miss_blocks(in.prefix_miss_blocks);
  prefix->set_dropped_blocks(in.prefix_dropped_blocks);
  v1::OffloadStats* o = out->mutable_offload();
  o->set_enabled(in.offload_store.has_value());
  o->set_session_count(in.offloaded_sessions);
  o->set_bytes(in.offloaded_bytes);
  if (in.offload_store) {
    o->set_host_bytes(in.offload_store->host_bytes);
    o->set_host_capacity(in.offload_store->host_capacity);
    o->set_disk_bytes(in.offload_store->disk_bytes);
    o->set_disk_capacity(in.offload_store->disk_capacity);
    o->set_spilled(in.offload_store->spilled);
  }
  o->set_offloaded(in.offload.offloaded);
  o->set_restored(in.offload.restored);
  o->set_refused(in.offload.refused);
  o->set_lost(in.offload.lost);
  o->set_evicted_idle(in.offload.evicted_idle);
  o->set_restore_seconds_sum(in.offload.restore_seconds_sum);
}

}  // namespace polykv::daemon
