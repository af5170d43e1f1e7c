// PageSource over a polykvd session (libpolykv_client): the worker's KV pages
// are the daemon's pool pages, mapped into this process; the worker writes new
// tokens' K/V into them in place and the daemon sees the committed count.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/worker/paged_kv_store.h"

namespace polykv::worker {

struct PoolPageSourceOptions {
  std::string socket;    // polykvd's Unix socket.
  std::string agent_id;
  std::string tenant = "default";
  std::string model_id;  // Reported to the daemon (e.g. the GGUF's general.name).
  KvShape shape;
  // nullopt: the daemon's choice.
  std::optional<kernels::PageFormat> key_format;
  std::optional<kernels::PageFormat> value_format;
  int block_tokens = 0;  // 0 = the daemon's default.
  // Ask for pages in the daemon's GPU memory (a cuda-tier polykvd; the store
  // then runs its kernels on the device, PagedKvStoreOptions::exec). Else
  // host pages: a daemon with device pages refuses the session.
  bool pages_on_device = false;
  // The text of one token id. When set, every commit reports the tokens'
  // structure tags (SlotTagger) with their turn and role; else turn and role.
  std::function<std::string(int32_t)> token_text;
};

// Connects, opens the session (maps the arenas) and checks that the pages
// the daemon hands out can hold this model's shape in their formats.
// UNAVAILABLE when no daemon answers; the daemon's own codes otherwise.
absl::StatusOr<std::unique_ptr<PageSource>> NewPoolPageSource(const PoolPageSourceOptions& o);

}  // namespace polykv::worker
