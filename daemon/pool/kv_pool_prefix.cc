// KvPool's shared prefixes (kv_pool.h, prefix_index.h): a session shares its
// leading full blocks; a fresh session of the same tenant and model attaches
// them as committed tokens. The blocks are the tenant's index's, charged to
// the pool once; COW is the compaction's own rule (it writes new pages).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"

namespace polykv::daemon {
namespace {

// Token ids one call may name: far past any context, under gRPC's limit.
constexpr size_t kMaxPrefixTokens = 1 << 20;

// What must agree for two sessions' blocks to be interchangeable: the
// model, the page layout and the block size.
std::string PrefixSpace(const Session& s) {
  const ModelProfile& m = s.profile;
  return absl::StrCat(m.model_id, "/", m.num_layers, "x", m.num_kv_heads, "x", m.head_dim, "/",
                      static_cast<int>(m.dtype), "/", static_cast<int>(s.shape.key_format), ":",
                      static_cast<int>(s.shape.value_format), "/", s.block_tokens);
}

// The session's first `n` slots are its first n tokens as written: never
// compacted (position i at slot i, one token each, in every record list),
// and the blocks holding them in the fill shape.
absl::Status CheckAsWritten(const Session& s, uint64_t n) {
  for (const auto& records : s.policy.records) {
    for (uint64_t i = 0; i < n; ++i) {
      if (records[i].meta.position != int64_t(i) || records[i].count != 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "slot ", i, " no longer holds token ", i, " alone (the session was compacted): "
            "share a prefix before compaction reaches it"));
      }
    }
  }
  for (uint64_t b = 0; b < n / s.block_tokens; ++b) {
    const Block& block = s.tables.blocks[b];
    if (block.prefix == 0 && !(block.shape == s.shape)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block ", b, " was requantized or lost layers: only blocks as written are shared"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> KvPool::SharePrefix(uint64_t session_id, absl::string_view token,
                                             const PeerCreds& peer,
                                             std::span<const int32_t> token_ids) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (token_ids.size() > s.tables.committed_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        token_ids.size(), " token ids for a session of ", s.tables.committed_tokens,
        " committed tokens: share only tokens written and committed"));
  }
  const uint64_t full = token_ids.size() / s.block_tokens * s.block_tokens;
  if (auto st = CheckAsWritten(s, full); !st.ok()) return st;
  auto shared = blocks_.SharePrefix(s.account, PrefixSpace(s), token_ids.first(full),
                                    s.block_tokens, s.tables.blocks, s.policy.records);
  if (!shared.ok()) return shared.status();
  return *shared * s.block_tokens;
}

absl::StatusOr<AttachPrefixResult> KvPool::AttachPrefix(uint64_t session_id,
                                                        absl::string_view token,
                                                        const PeerCreds& peer,
                                                        std::span<const int32_t> token_ids) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (token_ids.size() > kMaxPrefixTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(token_ids.size(), " token ids: at most ", kMaxPrefixTokens, " per call"));
  }
  if (!s.tables.blocks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a prefix is attached to a fresh session only (this one holds ", s.reserved_tokens(),
        " reserved tokens): attach before the first Reserve"));
  }
  if (draining_) return absl::UnavailableError("polykvd is draining; no new prefixes attached");
  // The agent's cap bounds what its sessions hold, shared or not.
  const QosRecord& qos = admission_.For(s.agent_id());
  uint64_t max_blocks = token_ids.size() / s.block_tokens;
  if (qos.max_bytes != 0) {
    const uint64_t held = blocks_.agent_bytes(s.agent_id());
    max_blocks = std::min(max_blocks, qos.max_bytes > held
                                          ? (qos.max_bytes - held) / s.shape.bytes() : 0);
  }
  AttachedPrefix got = blocks_.AttachPrefix(s.account, PrefixSpace(s), token_ids,
                                            s.block_tokens, max_blocks, s.policy.records.size());
  prefix_hits_ += got.blocks.size();
  prefix_misses_ += token_ids.size() / s.block_tokens - got.blocks.size();
  AttachPrefixResult out;
  for (Block& block : got.blocks) {
    s.tables.blocks.push_back(std::move(block));
    const auto index = static_cast<uint32_t>(s.tables.blocks.size() - 1);
    out.reserve.blocks.push_back(
        DescribeBlock(options_.superblock_bytes, s.tables.blocks.back(), index));
  }
  s.tables.committed_tokens = s.reserved_tokens();
  s.policy.records = std::move(got.records);
  s.policy.next_position = static_cast<int64_t>(s.tables.committed_tokens);
  out.attached_tokens = s.tables.committed_tokens;
  out.reserve.reserved_tokens = s.reserved_tokens();
  out.reserve.session_bytes = s.account.bytes + s.account.shared_bytes;
  out.reserve.new_arenas = blocks_.NewArenas(s.tenant(), s.known_arenas);
  return out;
}

}  // namespace polykv::daemon
