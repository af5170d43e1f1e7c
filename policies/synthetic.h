// Seeded synthetic session views: an agent transcript shape (system prompt,
// first user instruction, assistant turns with code, tool calls, tool outputs,
// errors) with heavy-tailed attention, block-coherent intent relevance and
// keys clustered per block. For property tests, the benchmark and
// `polykv-replay --synthetic`, so none of them needs a model.
//
// Deterministic for a given options struct on every platform (own PRNG, no
// std:: distributions).
#pragma once

#include <cstdint>

#include "policies/session_view.h"

namespace polykv::policies {

struct SyntheticOptions {
  uint64_t seed = 1;
  int num_layers = 4;
  int num_tokens = 1024;
  int key_dim = 16;  // 0 = no key summaries
  int mean_turn_tokens = 96;
  int mean_block_tokens = 20;
  // Per layer, this fraction of tokens (never positions < 8) is already gone
  // (an earlier compaction), and some survivors are merged slots (count > 1).
  double pre_evicted = 0.0;
  double pinned_fraction = 0.0;  // tokens pinned by the client
  bool entropy = true;           // report per-layer attention entropy
};

SessionView MakeSyntheticView(const SyntheticOptions& options);

// Small deterministic PRNG (splitmix64), shared by tests and tools.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int Int(int lo, int hi) {                                                   // [lo, hi]
    return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double Normal();

 private:
  uint64_t s_;
};

}  // namespace polykv::policies
