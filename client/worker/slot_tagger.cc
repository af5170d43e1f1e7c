#include "client/worker/slot_tagger.h"

#include <algorithm>

namespace polykv::worker {

SlotTagger::Report SlotTagger::Commit(uint64_t first_slot, std::span<const StepToken> tokens) {
  const size_t first_new = tokens_.size();
  for (const StepToken& t : tokens) {
    // A new turn is a new message even when its role is the previous one's.
    if (!tokens_.empty() && tokens_.back().turn != t.turn) tagger_.EndMessage();
    tagger_.Feed(token_text_(t.token_id), t.role);
    tokens_.push_back(t);
  }
  Report r;
  size_t from = first_new;
  r.first_slot = first_slot;
  // Re-report the provisional tail only when its slots run straight into the
  // new ones (same epoch, nothing in between).
  if (provisional_ && provisional_->slot + (first_new - provisional_->token) == first_slot) {
    from = provisional_->token;
    r.first_slot = provisional_->slot;
  }
  const std::vector<policies::StructTag>& tags = tagger_.tags();
  r.meta.reserve(tokens_.size() - from);
  for (size_t i = from; i < tokens_.size(); ++i) {
    policies::SlotMeta m;
    m.turn = tokens_[i].turn;
    m.role = tokens_[i].role;
    m.tag = tags[i];
    r.meta.push_back(m);
  }
  const size_t stable = tagger_.stable_prefix();
  if (stable < tokens_.size()) {
    const size_t p = std::max(stable, from);
    provisional_ = Provisional{p, r.first_slot + (p - from)};
  } else {
    provisional_.reset();
  }
  return r;
}

}  // namespace polykv::worker
