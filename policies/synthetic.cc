#include "policies/synthetic.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace polykv::policies {

double SplitMix::Normal() {
  const double u1 = std::max(Uniform(), 1e-300), u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

namespace {

BlockKind KindFor(Role role, SplitMix& rng) {
  switch (role) {
    case Role::kSystem:
    case Role::kUser:
      return BlockKind::kText;
    case Role::kToolCall:
      return BlockKind::kToolCall;
    case Role::kError:
      return BlockKind::kError;
    case Role::kToolOutput: {
      const double u = rng.Uniform();
      if (u < 0.5) return BlockKind::kToolOutput;
      if (u < 0.65) return BlockKind::kSignature;
      if (u < 0.9) return BlockKind::kBody;
      return BlockKind::kError;
    }
    case Role::kAssistant: {
      static constexpr BlockKind kCode[] = {
          BlockKind::kText,   BlockKind::kText,  BlockKind::kSignature,
          BlockKind::kBody,   BlockKind::kBody,  BlockKind::kComment,
          BlockKind::kImport, BlockKind::kClass, BlockKind::kStatement};
      return kCode[rng.Int(0, 8)];
    }
  }
  return BlockKind::kText;
}

}  // namespace

SessionView MakeSyntheticView(const SyntheticOptions& o) {
  SplitMix rng(o.seed * 0x2545F4914F6CDD1Dull + 17);
  SessionView view;
  view.key_dim = std::max(0, o.key_dim);
  view.shape = kernels::PageShape{16, 8, 128};
  const int n = std::max(0, o.num_tokens);
  view.tokens.resize(n);
  // Transcript shape.
  static constexpr Role kCycle[] = {Role::kAssistant, Role::kToolCall, Role::kToolOutput,
                                    Role::kAssistant, Role::kUser};
  int turn = 0, cycle = 0, left_in_turn = 0, left_in_block = 0;
  uint32_t block = 0;
  Role role = Role::kSystem;
  BlockKind kind = BlockKind::kText;
  uint16_t depth = 0;
  std::vector<int> block_start;
  for (int i = 0; i < n; ++i) {
    if (left_in_turn == 0) {
      if (i == 0) {
        role = Role::kSystem;
        left_in_turn = std::max(4, std::min(64, n / 10));
      } else {
        ++turn;
        if (turn == 1) {
          role = Role::kUser;
        } else {
          role = kCycle[cycle++ % 5];
          if (role == Role::kToolOutput && rng.Uniform() < 0.15) role = Role::kError;
        }
        left_in_turn = rng.Int(std::max(2, o.mean_turn_tokens / 2), o.mean_turn_tokens * 3 / 2);
      }
      left_in_block = 0;
    }
    if (left_in_block == 0) {
      ++block;
      kind = KindFor(role, rng);
      depth = static_cast<uint16_t>(kind == BlockKind::kBody ? rng.Int(1, 3) : rng.Int(0, 1));
      left_in_block = std::min(left_in_turn, rng.Int(2, std::max(2, 2 * o.mean_block_tokens)));
      block_start.push_back(i);
    }
    TokenMeta& t = view.tokens[i];
    t.position = i;
    t.turn = turn;
    t.role = role;
    t.tag = StructTag{kind, block, depth, false};
    t.pinned = o.pinned_fraction > 0 && i >= 8 && rng.Uniform() < o.pinned_fraction;
    --left_in_turn;
    --left_in_block;
    if (left_in_block == 0 || left_in_turn == 0) t.tag.boundary = true;
  }
  for (int s : block_start) view.tokens[s].tag.boundary = true;
  view.current_turn = turn;

  // Per-block latent vectors: intent relevance and key centres.
  const uint32_t num_blocks = block + 1;
  std::vector<float> block_rel(num_blocks);
  for (float& r : block_rel) r = static_cast<float>(std::tanh(rng.Normal()));
  std::vector<uint8_t> heavy(n);
  for (int i = 0; i < n; ++i) heavy[i] = rng.Uniform() < 0.05;

  view.layers.resize(std::max(0, o.num_layers));
  for (int l = 0; l < o.num_layers; ++l) {
    LayerView& layer = view.layers[l];
    if (o.entropy) {
      layer.score[ScoreStream::kEntropy] = static_cast<float>(1.0 + 3.0 * rng.Uniform());
    }
    std::vector<float> centres(static_cast<size_t>(num_blocks) * view.key_dim);
    for (float& c : centres) c = static_cast<float>(rng.Normal());
    const double noise = 0.15 + 0.6 * rng.Uniform();
    for (int i = 0; i < n; ++i) {
      const TokenMeta& t = view.tokens[i];
      if (o.pre_evicted > 0 && t.position >= 8 && rng.Uniform() < o.pre_evicted) continue;
      Slot s;
      s.token = static_cast<uint32_t>(i);
      s.count =
          (o.pre_evicted > 0 && rng.Uniform() < 0.1) ? static_cast<uint32_t>(rng.Int(2, 4)) : 1u;
      const double age = static_cast<double>(n - 1 - i);
      const double base = std::exp(0.8 * rng.Normal()) * (heavy[i] ? 10.0 : 1.0);
      using enum ScoreStream;
      s.score[kAttention] = static_cast<float>(base * (0.2 + std::exp(-age / 256.0)) / n);
      s.score[kObservation] =
          static_cast<float>(std::exp(0.8 * rng.Normal()) * (heavy[i] ? 5.0 : 1.0) / n);
      s.score[kIntent] = static_cast<float>(block_rel[t.tag.block_id] + 0.2 * rng.Normal());
      layer.slots.push_back(s);
      for (int j = 0; j < view.key_dim; ++j) {
        layer.keys.push_back(static_cast<float>(centres[size_t(t.tag.block_id) * view.key_dim + j] +
                                                noise * rng.Normal()));
      }
    }
  }
  return view;
}

}  // namespace polykv::policies
