#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "client/worker/kv_store.h"

namespace polykv::worker {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kSystem: return "system";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
    case Role::kTool: return "tool";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<LocalKvStore>> LocalKvStore::Create(
    const LocalKvStoreOptions& options) {
  const KvShape& s = options.shape;
  if (s.num_layers <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0 || options.max_slots <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LocalKvStore: bad shape (layers ", s.num_layers, ", kv heads ", s.num_kv_heads,
        ", head dim ", s.head_dim, ", max slots ", options.max_slots, ")"));
  }
  std::unique_ptr<LocalKvStore> store(new LocalKvStore(options));
  store->k_.resize(s.num_layers);
  store->v_.resize(s.num_layers);
  return store;
}

int64_t LocalKvStore::bytes() const {
  return 2 * int64_t{options_.shape.num_layers} * num_slots_ * row_ * int64_t{sizeof(float)};
}

absl::Status LocalKvStore::BeginStep(std::span<const TokenMeta> tokens) {
  if (step_tokens_ != 0) return absl::FailedPreconditionError("BeginStep inside a step");
  if (tokens.empty()) return absl::InvalidArgumentError("BeginStep with no tokens");
  if (num_slots_ + static_cast<int64_t>(tokens.size()) > options_.max_slots) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "local KV cache full: ", num_slots_, " + ", tokens.size(), " tokens > max ",
        options_.max_slots, " (raise --max-context)"));
  }
  step_tokens_ = static_cast<int>(tokens.size());
  next_layer_ = 0;
  meta_.insert(meta_.end(), tokens.begin(), tokens.end());
  if (options_.track_attention_mass) mass_.resize(num_slots_ + step_tokens_, 0.0f);
  return absl::OkStatus();
}

absl::Status LocalKvStore::Append(int layer, const float* k, const float* v) {
  if (step_tokens_ == 0) return absl::FailedPreconditionError("Append outside a step");
  if (layer != next_layer_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Append(layer ", layer, ") out of order; expected ", next_layer_));
  }
  const int64_t n = int64_t{step_tokens_} * row_;
  k_[layer].insert(k_[layer].end(), k, k + n);
  v_[layer].insert(v_[layer].end(), v, v + n);
  ++next_layer_;
  return absl::OkStatus();
}

absl::Status LocalKvStore::Attend(int layer, int num_heads, const float* q, float* out) {
  const int kvh = options_.shape.num_kv_heads;
  const int d = options_.shape.head_dim;
  if (step_tokens_ == 0 || layer >= next_layer_) {
    return absl::FailedPreconditionError("Attend before Append in this step");
  }
  if (num_heads <= 0 || num_heads % kvh != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_heads, " query heads is not a multiple of ", kvh, " KV heads"));
  }
  const int n = step_tokens_;
  const int64_t t = num_slots_ + n;
  const int group = num_heads / kvh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  scores_.resize(static_cast<size_t>(n) * t);
  const float* kl = k_[layer].data();
  const float* vl = v_[layer].data();
  for (int h = 0; h < num_heads; ++h) {
    const int g = h / group;
    // S[n, t] = scale * Q_h[n, d] . K_g[t, d]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, static_cast<int>(t), d, scale,
                q + h * d, num_heads * d, kl + g * d, static_cast<int>(row_), 0.0f,
                scores_.data(), static_cast<int>(t));
    for (int i = 0; i < n; ++i) {
      float* s = scores_.data() + static_cast<int64_t>(i) * t;
      const int64_t visible = num_slots_ + i + 1;  // Causal inside the step.
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, s[j]);
      double sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < visible; ++j) s[j] *= inv;
      std::fill(s + visible, s + t, 0.0f);
      if (options_.track_attention_mass) {
        for (int64_t j = 0; j < visible; ++j) mass_[j] += s[j];
      }
    }
    // O_h[n, d] = P[n, t] . V_g[t, d]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, static_cast<int>(t), 1.0f,
                scores_.data(), static_cast<int>(t), vl + g * d, static_cast<int>(row_), 0.0f,
                out + h * d, num_heads * d);
  }
  return absl::OkStatus();
}

absl::Status LocalKvStore::EndStep() {
  if (step_tokens_ == 0) return absl::FailedPreconditionError("EndStep outside a step");
  if (next_layer_ != options_.shape.num_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EndStep after ", next_layer_, " of ", options_.shape.num_layers, " layers"));
  }
  num_slots_ += step_tokens_;
  step_tokens_ = 0;
  return absl::OkStatus();
}

}  // namespace polykv::worker
