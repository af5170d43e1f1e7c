// PrefixCacheClient: the tenant's shared prefix blocks without a session,
// for an engine's connector (proto/polykv/v1/prefix.proto says what each
// call does; docs/prefix-sharing.md how blocks are found and charged).
//
//   auto cache = polykv::PrefixCacheClient::Connect("/run/polykv/polykvd.sock");
//   polykv::v1::PrefixSpace space;      // tenant, model profile, formats, block size
//   auto hit = (*cache)->Lookup(space, token_ids);      // leading tokens held
//   auto got = (*cache)->Read(space, token_ids, 0, 8);  // their pages, by value
//   (*cache)->Store(space, token_ids, first_block, pages);  // what it computed
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "polykv/v1/prefix.grpc.pb.h"

namespace polykv {

class PrefixCacheClient {
 public:
  static absl::StatusOr<std::unique_ptr<PrefixCacheClient>> Connect(
      const std::string& socket_path, int timeout_ms = 5000);
  explicit PrefixCacheClient(std::unique_ptr<v1::PrefixCache::Stub> stub)
      : stub_(std::move(stub)) {}

  // Leading tokens of `token_ids` the tenant's blocks hold (whole blocks).
  absl::StatusOr<uint64_t> Lookup(const v1::PrefixSpace& space,
                                  std::span<const int32_t> token_ids);
  // Pages of blocks first_block .. (as many as exist, at most max_blocks).
  absl::StatusOr<v1::ReadPrefixResponse> Read(const v1::PrefixSpace& space,
                                              std::span<const int32_t> token_ids,
                                              uint64_t first_block, uint32_t max_blocks);
  // Stores blocks first_block, ... from `pages` (2 per layer per block);
  // returns the chain's leading blocks stored now.
  absl::StatusOr<uint64_t> Store(const v1::PrefixSpace& space, std::span<const int32_t> token_ids,
                                 uint64_t first_block, std::span<const std::string> pages);

 private:
  std::unique_ptr<v1::PrefixCache::Stub> stub_;
};

}  // namespace polykv
