// SlotTagger: the structure tags of the slots a worker commits, for the
// daemon's structure-aware policies (issue 12: everything a policy reads
// reaches the daemon). It runs policies' incremental StructureTagger over the
// text of each committed token, so the daemon's `structural` policy sees the
// same tags policies' StructureTagger gives the same text offline.
//
// The tagger knows a line's kind only once the line is complete, so tags of
// the tokens of an unfinished line are provisional. Each report therefore
// starts at the first token reported provisionally in this epoch and covers
// the new tokens: ReportSlots overwrites the daemon's metadata, so the
// correction rides on the next commit with no extra RPC. When the daemon
// compacted the session in between (its slots moved), earlier provisional tags
// stay as reported; the daemon maps slots, not tokens.
//
// Not thread-safe: driven by the page source's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "client/worker/kv_store.h"
#include "policies/session_view.h"
#include "policies/tagger.h"

namespace polykv::worker {

class SlotTagger {
 public:
  // token_text: the decoded text of one token id (special tokens: empty).
  explicit SlotTagger(std::function<std::string(int32_t)> token_text)
      : token_text_(std::move(token_text)) {}

  struct Report {
    uint64_t first_slot = 0;
    std::vector<policies::SlotMeta> meta;  // slots [first_slot, first_slot + meta.size())
  };
  // `tokens` were committed at slots [first_slot, first_slot + tokens.size()),
  // in conversation order.
  Report Commit(uint64_t first_slot, std::span<const StepToken> tokens);
  // The daemon's table changed: slot numbers of earlier commits no longer hold.
  void SlotsMoved() { provisional_.reset(); }

  // Tokens tagged so far (for tests).
  size_t num_tokens() const { return tagger_.tags().size(); }

 private:
  struct Provisional {
    size_t token = 0;  // index in the tagger's token order
    uint64_t slot = 0;
  };

  const std::function<std::string(int32_t)> token_text_;
  policies::StructureTagger tagger_;
  std::vector<StepToken> tokens_;          // every token fed, in order (turn, role)
  std::optional<Provisional> provisional_;  // the first token reported before its tag was final
};

}  // namespace polykv::worker
