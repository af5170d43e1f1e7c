// Next-token sampling: greedy (temperature 0) or temperature + top-p
// (nucleus) with a seeded generator, so a run is reproducible from --seed.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace polykv::worker {

struct SamplerOptions {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties).
  float top_p = 1.0f;        // Keep the smallest prefix of tokens by
                             // probability whose mass reaches top_p.
  uint64_t seed = 0;
};

// Not thread-safe (holds the generator).
class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // REQUIRES: logits non-empty.
  int32_t Sample(std::span<const float> logits);

 private:
  const SamplerOptions options_;
  std::mt19937_64 rng_;
};

int32_t Argmax(std::span<const float> logits);

}  // namespace polykv::worker
