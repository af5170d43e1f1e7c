#include "polykv/polykv_c.h"

#include <optional>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "polykv/client.h"

struct pkv_client {
  std::unique_ptr<polykv::Client> impl;
};
struct pkv_session {
  std::unique_ptr<polykv::Session> impl;
  uint32_t num_layers = 0;  // of the profile it was opened with
};

namespace {

using polykv::DType;
using polykv::PageFormat;
using polykv::ScoreStream;

// The C constants are the ABI; they must keep meaning the C++ values.
static_assert(PKV_FORMAT_F32 == static_cast<int>(PageFormat::kF32));
static_assert(PKV_FORMAT_F16 == static_cast<int>(PageFormat::kF16));
static_assert(PKV_FORMAT_BF16 == static_cast<int>(PageFormat::kBF16));
static_assert(PKV_FORMAT_FP8_E4M3 == static_cast<int>(PageFormat::kFP8E4M3));
static_assert(PKV_FORMAT_INT8 == static_cast<int>(PageFormat::kInt8));
static_assert(PKV_FORMAT_INT4 == static_cast<int>(PageFormat::kInt4));
static_assert(PKV_FORMAT_INT2 == static_cast<int>(PageFormat::kInt2));
static_assert(PKV_ROLE_SYSTEM == static_cast<int>(polykv::policies::Role::kSystem));
static_assert(PKV_ROLE_USER == static_cast<int>(polykv::policies::Role::kUser));
static_assert(PKV_ROLE_ASSISTANT == static_cast<int>(polykv::policies::Role::kAssistant));
static_assert(PKV_ROLE_TOOL_CALL == static_cast<int>(polykv::policies::Role::kToolCall));
static_assert(PKV_ROLE_TOOL_OUTPUT == static_cast<int>(polykv::policies::Role::kToolOutput));
static_assert(PKV_ROLE_ERROR == static_cast<int>(polykv::policies::Role::kError));
// Each PKV_STREAM_* is held to its ScoreStream by tests/integration/c_abi_test.cc.
static_assert(PKV_NUM_STREAMS == polykv::policies::kNumScoreStreams,
              "a stream without a PKV_STREAM_*");
static_assert(PKV_DTYPE_F32 == static_cast<int>(DType::kF32));
static_assert(PKV_DTYPE_F16 == static_cast<int>(DType::kF16));
static_assert(PKV_DTYPE_BF16 == static_cast<int>(DType::kBF16));

thread_local std::string last_error;

int Report(const absl::Status& s) {
  last_error = s.ok() ? "" : std::string(s.message());
  return static_cast<int>(s.code());
}

// Checked here, not left to the daemon: the C++ types are narrower than
// uint32_t, so an unknown value would otherwise wrap into a valid one.
absl::StatusOr<DType> DTypeFromC(uint32_t v) {
  switch (v) {
    case PKV_DTYPE_DEFAULT:
    case PKV_DTYPE_F16: return DType::kF16;
    case PKV_DTYPE_F32: return DType::kF32;
    case PKV_DTYPE_BF16: return DType::kBF16;
    default: return absl::InvalidArgumentError(absl::StrCat("dtype: unknown dtype ", v));
  }
}

absl::StatusOr<std::optional<PageFormat>> FormatFromC(uint32_t v, absl::string_view field) {
  if (v == PKV_FORMAT_DEFAULT) return std::optional<PageFormat>();
  if (!polykv::kernels::IsValidFormat(static_cast<int>(v))) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": unknown page format ", v));
  }
  return std::optional<PageFormat>(static_cast<PageFormat>(v));
}

// Checked here for the same reason: role, kind and depth are narrower in C++.
absl::StatusOr<polykv::SlotMeta> MetaFromC(const pkv_slot_meta& m, size_t i) {
  namespace p = polykv::policies;
  if (m.role >= p::kNumRoles || m.block_kind >= p::kNumBlockKinds || m.depth > UINT16_MAX ||
      m.turn < 0 || m.boundary > 1 || m.pinned > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "meta[", i, "]: role ", m.role, ", block_kind ", m.block_kind, ", depth ", m.depth,
        ", turn ", m.turn, " or a flag out of range"));
  }
  polykv::SlotMeta out;
  out.turn = m.turn;
  out.role = static_cast<p::Role>(m.role);
  out.tag.kind = static_cast<p::BlockKind>(m.block_kind);
  out.tag.block_id = m.block_id;
  out.tag.depth = static_cast<uint16_t>(m.depth);
  out.tag.boundary = m.boundary != 0;
  out.pinned = m.pinned != 0;
  return out;
}

}  // namespace

extern "C" {

int pkv_connect(const char* socket_path, pkv_client** out) {
  if (!socket_path || !out) return Report(absl::InvalidArgumentError("null argument"));
  auto c = polykv::Client::Connect(socket_path);
  if (!c.ok()) return Report(c.status());
  *out = new pkv_client{*std::move(c)};
  return Report(absl::OkStatus());
}

void pkv_client_free(pkv_client* client) { delete client; }

int pkv_session_open(pkv_client* client, const pkv_session_options* o, pkv_session** out) {
  if (!client || !o || !out || !o->agent_id) {
    return Report(absl::InvalidArgumentError("null argument"));
  }
  polykv::SessionOptions so;
  so.agent_id = o->agent_id;
  if (o->tenant) so.tenant = o->tenant;
  auto dtype = DTypeFromC(o->dtype);
  if (!dtype.ok()) return Report(dtype.status());
  auto kf = FormatFromC(o->key_format, "key_format");
  if (!kf.ok()) return Report(kf.status());
  auto vf = FormatFromC(o->value_format, "value_format");
  if (!vf.ok()) return Report(vf.status());
  so.profile = {o->num_layers, o->num_kv_heads, o->head_dim, *dtype, ""};
  so.key_format = *kf;
  so.value_format = *vf;
  so.block_tokens = o->block_tokens;
  auto s = client->impl->OpenSession(so);
  if (!s.ok()) return Report(s.status());
  *out = new pkv_session{*std::move(s), o->num_layers};
  return Report(absl::OkStatus());
}

int pkv_session_close(pkv_session* session) {
  if (!session) return 0;
  absl::Status s = session->impl->Close();
  delete session;
  return Report(s);
}

uint64_t pkv_session_id(const pkv_session* s) { return s ? s->impl->info().session_id : 0; }
uint32_t pkv_block_tokens(const pkv_session* s) { return s ? s->impl->info().block_tokens : 0; }
int pkv_wants(const pkv_session* s, uint32_t stream) {
  return s && stream < polykv::policies::kNumScoreStreams &&
                 s->impl->info().wants.has(static_cast<ScoreStream>(stream))
             ? 1
             : 0;
}
int pkv_wants_per_layer(const pkv_session* s) {
  return s && s->impl->info().wants.per_layer ? 1 : 0;
}
float pkv_attention_decay(const pkv_session* s) {
  return s ? s->impl->info().wants.attention_decay : 1.f;
}

int pkv_reserve(pkv_session* s, uint64_t n) {
  if (!s) return Report(absl::InvalidArgumentError("null session"));
  return Report(s->impl->Reserve(n).status());
}

int pkv_commit(pkv_session* s, uint64_t n) {
  if (!s) return Report(absl::InvalidArgumentError("null session"));
  return Report(s->impl->Commit(n));
}

int pkv_release(pkv_session* s, uint64_t keep) {
  if (!s) return Report(absl::InvalidArgumentError("null session"));
  return Report(s->impl->Release(keep));
}

size_t pkv_num_blocks(const pkv_session* s) { return s ? s->impl->blocks().size() : 0; }

int pkv_block_pages(const pkv_session* s, size_t block, pkv_page* pages, size_t capacity,
                    size_t* num_pages) {
  if (!s || !num_pages || (!pages && capacity)) return Report(absl::InvalidArgumentError("null argument"));
  const auto& blocks = s->impl->blocks();
  if (block >= blocks.size()) return Report(absl::OutOfRangeError("no such block"));
  const auto& src = blocks[block].pages;
  *num_pages = src.size();
  for (size_t i = 0; i < src.size() && i < capacity; ++i) {
    const auto& p = src[i];
    pages[i] = pkv_page{p.page_id, p.arena_id, p.layer, p.is_value ? 1u : 0u,
                        static_cast<uint32_t>(p.format), p.size_bytes, blocks[block].block_index,
                        p.addr};
  }
  return Report(absl::OkStatus());
}

int pkv_sync(pkv_session* s, int* changed) {
  if (!s) return Report(absl::InvalidArgumentError("null session"));
  auto r = s->impl->Sync();
  if (!r.ok()) return Report(r.status());
  if (changed) *changed = *r ? 1 : 0;
  return Report(absl::OkStatus());
}

uint64_t pkv_epoch(const pkv_session* s) { return s ? s->impl->epoch() : 0; }

int pkv_idle(pkv_session* s) {
  if (!s) return Report(absl::InvalidArgumentError("null session"));
  return Report(s->impl->Idle());
}

uint64_t pkv_moves(const pkv_session* s) { return s ? s->impl->moves() : 0; }

uint64_t pkv_committed_tokens(const pkv_session* s) {
  return s ? s->impl->committed_tokens() : 0;
}

namespace {
// OUT_OF_RANGE unless slots [first, first + n) are among the `described` ones
// of the last changed sync.
absl::Status CheckDescribedSlots(uint64_t first, size_t n, size_t described) {
  if (first <= described && n <= described - first) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("slots [", first, ", ", first + n, ") past the ",
                                            described, " the last changed sync described"));
}
}  // namespace

int pkv_layer_slot_info(const pkv_session* s, uint32_t layer, uint64_t first, size_t n,
                        int64_t* positions) {
  if (!s) return Report(absl::InvalidArgumentError("null session"));
  const auto& all = s->impl->layer_slot_positions();
  if (all.empty()) return layer < s->num_layers ? pkv_slot_info(s, first, n, positions, nullptr)
                                                : Report(absl::OutOfRangeError("no such layer"));
  const size_t per = s->impl->slot_positions().size();
  if (layer >= s->num_layers || per * s->num_layers != all.size()) {
    return Report(absl::OutOfRangeError(absl::StrCat("no layer ", layer, " of ", s->num_layers)));
  }
  if (auto st = CheckDescribedSlots(first, n, per); !st.ok()) return Report(st);
  for (size_t i = 0; i < n && positions; ++i) positions[i] = all[layer * per + first + i];
  return Report(absl::OkStatus());
}

int pkv_slot_info(const pkv_session* s, uint64_t first, size_t n, int64_t* positions,
                  uint32_t* counts) {
  if (!s) return Report(absl::InvalidArgumentError("null session"));
  const auto& pos = s->impl->slot_positions();
  const auto& cnt = s->impl->slot_counts();
  if (auto st = CheckDescribedSlots(first, n, pos.size()); !st.ok()) return Report(st);
  for (size_t i = 0; i < n; ++i) {
    if (positions) positions[i] = pos[first + i];
    if (counts) counts[i] = cnt[first + i];
  }
  return Report(absl::OkStatus());
}

int pkv_report_slots(pkv_session* s, uint64_t first, size_t n, const pkv_slot_meta* meta,
                     uint32_t current_turn) {
  if (!s || (!meta && n)) return Report(absl::InvalidArgumentError("null argument"));
  std::vector<polykv::SlotMeta> m;
  m.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto one = MetaFromC(meta[i], i);
    if (!one.ok()) return Report(one.status());
    m.push_back(*one);
  }
  return Report(s->impl->ReportSlots(first, m, {}, current_turn));
}

int pkv_report(pkv_session* s, uint32_t stream, uint64_t first, int per_layer,
               const float* values, size_t count) {
  if (!s || (!values && count)) return Report(absl::InvalidArgumentError("null argument"));
  if (stream >= polykv::policies::kNumScoreStreams) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
        "stream ", stream, " unknown (0..", polykv::policies::kNumScoreStreams - 1, ")")));
  }
  return Report(s->impl->Report(static_cast<ScoreStream>(stream), first,
                                std::vector<float>(values, values + count), per_layer != 0));
}

const char* pkv_last_error(void) { return last_error.c_str(); }

}  // extern "C"
