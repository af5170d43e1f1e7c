// KvPool's shared prefixes (kv_pool.h, prefix_index.h): a session shares its
// leading full blocks; a fresh session of the same tenant and model attaches
// them as committed tokens. The blocks are the tenant's index's, charged to
// the pool once; COW is the compaction's own rule (it writes new pages).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/pool/validation.h"

namespace polykv::daemon {
namespace {

// Token ids one call may name: far past any context, under gRPC's limit.
constexpr size_t kMaxPrefixTokens = 1 << 20;

// Bytes of the pages one connector call reads at most (under the lock).
constexpr uint64_t kMaxReadBytes = 16ull << 20;

// What must agree for two sessions' blocks to be interchangeable: the
// model, the page layout and the block size.
std::string PrefixSpace(const ModelProfile& m, const BlockShape& shape, uint32_t block_tokens) {
  return absl::StrCat(m.model_id, "/", m.num_layers, "x", m.num_kv_heads, "x", m.head_dim, "/",
                      static_cast<int>(m.dtype), "/", static_cast<int>(shape.key_format), ":",
                      static_cast<int>(shape.value_format), "/", block_tokens);
}
std::string PrefixSpace(const Session& s) { return PrefixSpace(s.profile, s.shape, s.block_tokens); }

// A connector's space, checked: its blocks' shape and key.
struct ConnectorSpace {
  std::string key;
  BlockShape shape;
  kernels::PageShape page;
  uint32_t block_tokens = 0;
  // Bytes of page i of a block (K for even i) without the size class's padding.
  uint64_t content(size_t i) const {
    return kernels::PageBytes(i % 2 ? shape.value_format : shape.key_format,
                              i % 2 ? kernels::KvKind::kValue : kernels::KvKind::kKey, page);
  }
  uint64_t block_content() const { return shape.layers * (content(0) + content(1)); }
};

absl::StatusOr<ConnectorSpace> CheckSpace(const PrefixSpaceRequest& r, uint64_t max_page_bytes,
                                          size_t num_ids) {
  if (auto s = ValidateName("tenant", r.tenant, kMaxTenantLen); !s.ok()) return s;
  if (auto s = ValidateProfile(r.profile); !s.ok()) return s;
  if (auto s = ValidateBlockTokens(r.block_tokens); !s.ok()) return s;
  if (num_ids > kMaxPrefixTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_ids, " token ids: at most ", kMaxPrefixTokens, " per call"));
  }
  ConnectorSpace out;
  out.block_tokens = r.block_tokens;
  out.page = {static_cast<int>(r.block_tokens), static_cast<int>(r.profile.num_kv_heads),
              static_cast<int>(r.profile.head_dim)};
  const PageFormat dtype_format = FormatForDtype(r.profile.dtype);
  auto shape = MakeBlockShape(r.profile.num_layers, out.page, r.key_format.value_or(dtype_format),
                              r.value_format.value_or(dtype_format), max_page_bytes);
  if (!shape.ok()) return shape.status();
  out.shape = *std::move(shape);
  out.key = PrefixSpace(r.profile, out.shape, r.block_tokens);
  return out;
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
  s.policy.attention_aged_at = s.policy.next_position;
  out.attached_tokens = s.tables.committed_tokens;
  out.reserve.reserved_tokens = s.reserved_tokens();
  out.reserve.session_bytes = s.account.bytes + s.account.shared_bytes;
  out.reserve.new_arenas = blocks_.NewArenas(s.tenant(), s.known_arenas);
  return out;
}

absl::StatusOr<uint64_t> KvPool::LookupPrefix(const PrefixSpaceRequest& r,
                                              std::span<const int32_t> token_ids) {
  auto space = CheckSpace(r, options_.superblock_bytes, token_ids.size());
  if (!space.ok()) return space.status();
  absl::MutexLock lock(&mu_);
  auto tenant = TenantKey(r.tenant, r.peer);
  if (!tenant.ok()) return tenant.status();
  const uint64_t asked = token_ids.size() / space->block_tokens;
  const uint64_t found =
      blocks_.FindPrefix(*tenant, space->key, token_ids, space->block_tokens, asked).size();
  prefix_hits_ += found;
  prefix_misses_ += asked - found;
  return found * space->block_tokens;
}

absl::StatusOr<PrefixPages> KvPool::ReadPrefix(const PrefixSpaceRequest& r,
                                               std::span<const int32_t> token_ids,
                                               uint64_t first_block, uint64_t max_blocks) {
  auto space = CheckSpace(r, options_.superblock_bytes, token_ids.size());
  if (!space.ok()) return space.status();
  max_blocks = std::min(max_blocks, kMaxReadBytes / std::max<uint64_t>(1, space->block_content()));
  PrefixPages out;
  out.first_block = first_block;
  absl::MutexLock lock(&mu_);
  auto tenant = TenantKey(r.tenant, r.peer);
  if (!tenant.ok()) return tenant.status();
  if (first_block >= token_ids.size() / space->block_tokens) return out;  // past the ids
  const uint64_t want = first_block + std::min(max_blocks, kMaxPrefixTokens);
  std::vector<Block> chain =
      blocks_.FindPrefix(*tenant, space->key, token_ids, space->block_tokens, want);
  for (uint64_t b = first_block; b < chain.size(); ++b) {
    for (size_t i = 0; i < chain[b].pages.size(); ++i) {
      const uint64_t addr = blocks_.HostAddress(*tenant, chain[b].pages[i]);
      if (addr == 0) {
        return absl::UnimplementedError(
            "the prefix's pages are not in host memory (reading CUDA pages is not built yet)");
      }
      out.pages.emplace_back(reinterpret_cast<const char*>(addr), space->content(i));
    }
    ++out.blocks;
  }
  return out;
}

absl::StatusOr<uint64_t> KvPool::StorePrefix(const PrefixSpaceRequest& r,
                                             std::span<const int32_t> token_ids,
                                             uint64_t first_block,
                                             std::span<const std::string_view> pages) {
  auto space = CheckSpace(r, options_.superblock_bytes, token_ids.size());
  if (!space.ok()) return space.status();
  if (options_.arena_kind != ArenaKind::kHostShm) {
    return absl::UnimplementedError(
        "storing prefix pages into device arenas is not built yet (host pools only)");
  }
  const size_t per_block = space->shape.num_entries();
  if (pages.empty() || pages.size() % per_block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        pages.size(), " pages: a whole number of blocks of ", per_block,
        " pages (K and V of each layer) is stored, at least one"));
  }
  const uint64_t count = pages.size() / per_block;
  if (first_block > kMaxPrefixTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_block ", first_block, ": past any prefix (", kMaxPrefixTokens,
                     " token ids at most)"));
  }
  if ((first_block + count) * space->block_tokens > token_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "blocks ", first_block, "..", first_block + count - 1, " of ", space->block_tokens,
        " tokens need ", (first_block + count) * space->block_tokens, " token ids; got ",
        token_ids.size()));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i].size() != space->content(i % per_block)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page ", i, " has ", pages[i].size(), " bytes; a ", (i % 2 ? "value" : "key"),
          " page of this space has ", space->content(i % per_block)));
    }
  }
  absl::MutexLock lock(&mu_);
  auto tenant = TenantKey(r.tenant, r.peer);
  if (!tenant.ok()) return tenant.status();
  if (draining_) return absl::UnavailableError("polykvd is draining; no prefixes stored");
  return blocks_.StorePrefix(
      *tenant, space->key, token_ids, space->block_tokens, space->shape, first_block, count,
      [&](uint64_t b, std::span<std::byte* const> addrs) {
        for (size_t i = 0; i < addrs.size(); ++i) {
          const std::string_view src = pages[(b - first_block) * per_block + i];
          std::memcpy(addrs[i], src.data(), src.size());
        }
      });
}

}  // namespace polykv::daemon
