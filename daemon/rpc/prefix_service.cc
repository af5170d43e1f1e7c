#include "daemon/rpc/prefix_service.h"

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/rpc/convert.h"

namespace polykv::daemon {
namespace {

std::vector<std::string_view> Pages(
    const google::protobuf::RepeatedPtrField<std::string>& pages) {
  return {pages.begin(), pages.end()};
}

}  // namespace

grpc::Status PrefixService::LookupPrefix(grpc::ServerContext* c,
                                         const v1::LookupPrefixRequest* req,
                                         v1::LookupPrefixResponse* resp) {
  return Handle(ctx_, c, "LookupPrefix", [&](const PeerCreds& peer) -> absl::Status {
    auto space = FromProto(req->space(), peer);
    if (!space.ok()) return space.status();
    auto out = ctx_.pool->LookupPrefix(*space, TokenIds(req->token_ids()));
    if (!out.ok()) return out.status();
    resp->set_matched_tokens(*out);
    return absl::OkStatus();
  });
}

grpc::Status PrefixService::ReadPrefix(grpc::ServerContext* c, const v1::ReadPrefixRequest* req,
                                       v1::ReadPrefixResponse* resp) {
  return Handle(ctx_, c, "ReadPrefix", [&](const PeerCreds& peer) -> absl::Status {
    auto space = FromProto(req->space(), peer);
    if (!space.ok()) return space.status();
    auto out = ctx_.pool->ReadPrefix(*space, TokenIds(req->token_ids()), req->first_block(),
                                     req->max_blocks());
    if (!out.ok()) return out.status();
    resp->set_first_block(out->first_block);
    resp->set_blocks(out->blocks);
    for (std::string& p : out->pages) resp->add_pages(std::move(p));
    return absl::OkStatus();
  });
}

grpc::Status PrefixService::StorePrefix(grpc::ServerContext* c, const v1::StorePrefixRequest* req,
                                        v1::StorePrefixResponse* resp) {
  return Handle(ctx_, c, "StorePrefix", [&](const PeerCreds& peer) -> absl::Status {
    auto space = FromProto(req->space(), peer);
    if (!space.ok()) return space.status();
    const std::vector<std::string_view> pages = Pages(req->pages());
    auto out = ctx_.pool->StorePrefix(*space, TokenIds(req->token_ids()), req->first_block(),
                                      pages);
    if (!out.ok()) return out.status();
    resp->set_chain_blocks(*out);
    return absl::OkStatus();
  });
}

}  // namespace polykv::daemon
