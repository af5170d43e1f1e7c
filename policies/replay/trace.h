// Session traces for offline replay (format: docs/policies.md, "Trace format").
//
// A trace is JSONL: one header line, then one line per token in arrival order
// with its layer-independent metadata and its per-layer score streams, as the
// worker reports them. Parsing is pure (string in, view out); the tool does
// the file I/O.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/plan.h"
#include "policies/session_view.h"

namespace polykv::policies::replay {

struct Trace {
  SessionView view;                // every token, every layer (before any compaction)
  std::vector<std::string> texts;  // [num_tokens] token text ("" when not recorded)
  // [num_layers][num_tokens]: whether the token is in that layer's cache
  // (traces recorded after a compaction may lack some).
  std::vector<std::vector<bool>> present;
};

// Parses a JSONL trace. Errors name the line.
absl::StatusOr<Trace> ParseTrace(std::string_view jsonl);

// Writes a view (all slots of every layer) as a JSONL trace, with texts when
// given. ParseTrace(WriteTrace(v)) reproduces v for views whose layers hold
// every token.
std::string WriteTrace(const SessionView& view, const std::vector<std::string>& texts = {});

// Re-tags every token from its text with StructureTagger (role per token).
void Retag(Trace* trace);

// The first `n` tokens of the trace as a view (online replay reveals tokens in
// arrival order).
SessionView Prefix(const Trace& trace, size_t n);

}  // namespace polykv::policies::replay
