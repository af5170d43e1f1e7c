#include "polykv/prefix_cache.h"

#include "client/lib/channel.h"

namespace polykv {

using internal::FromGrpc;
using internal::SetDeadline;

absl::StatusOr<std::unique_ptr<PrefixCacheClient>> PrefixCacheClient::Connect(
    const std::string& socket_path, int timeout_ms) {
  auto channel = internal::Dial(socket_path, timeout_ms);
  if (!channel.ok()) return channel.status();
  return std::make_unique<PrefixCacheClient>(v1::PrefixCache::NewStub(*channel));
}

absl::StatusOr<uint64_t> PrefixCacheClient::Lookup(const v1::PrefixSpace& space,
                                                   std::span<const int32_t> token_ids) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::LookupPrefixRequest req;
  *req.mutable_space() = space;
  req.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  v1::LookupPrefixResponse out;
  if (auto s = FromGrpc(stub_->LookupPrefix(&ctx, req, &out)); !s.ok()) return s;
  return out.matched_tokens();
}

absl::StatusOr<v1::ReadPrefixResponse> PrefixCacheClient::Read(const v1::PrefixSpace& space,
                                                               std::span<const int32_t> token_ids,
                                                               uint64_t first_block,
                                                               uint32_t max_blocks) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ReadPrefixRequest req;
  *req.mutable_space() = space;
  req.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  req.set_first_block(first_block);
  req.set_max_blocks(max_blocks);
  v1::ReadPrefixResponse out;
  if (auto s = FromGrpc(stub_->ReadPrefix(&ctx, req, &out)); !s.ok()) return s;
  return out;
}

absl::StatusOr<uint64_t> PrefixCacheClient::Store(const v1::PrefixSpace& space,
                                                  std::span<const int32_t> token_ids,
                                                  uint64_t first_block,
                                                  std::span<const std::string> pages) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::StorePrefixRequest req;
  *req.mutable_space() = space;
  req.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  req.set_first_block(first_block);
  for (const std::string& p : pages) req.add_pages(p);
  v1::StorePrefixResponse out;
  if (auto s = FromGrpc(stub_->StorePrefix(&ctx, req, &out)); !s.ok()) return s;
  return out.chain_blocks();
}

}  // namespace polykv
