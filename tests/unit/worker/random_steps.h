// Model-free steps for PagedKvStore tests: random K/V rows and queries on a
// small shape, one step of them through BeginStep/Append/Attend/EndStep.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "gtest/gtest.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace polykv::worker::testing {

inline constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 32, kQHeads = 4, kBlock = 16;
inline constexpr int kRow = kKvHeads * kHeadDim;

inline KvShape Shape() { return KvShape{kLayers, kKvHeads, kHeadDim}; }

// Per layer, the K and V rows of some tokens: [layer][tokens][kRow].
struct Rows {
  std::vector<std::vector<float>> k, v;
  int num_tokens() const { return static_cast<int>(k[0].size() / kRow); }
};

inline Rows RandomRows(int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Rows r;
  r.k.assign(kLayers, std::vector<float>(static_cast<size_t>(n) * kRow));
  r.v = r.k;
  for (int l = 0; l < kLayers; ++l) {
    for (float& x : r.k[l]) x = dist(rng);
    for (float& x : r.v[l]) x = dist(rng);
  }
  return r;
}

// Rows `slots` of `from`, in that order.
inline Rows Pick(const Rows& from, const std::vector<int>& slots) {
  Rows r;
  r.k.assign(kLayers, {});
  r.v.assign(kLayers, {});
  for (int l = 0; l < kLayers; ++l) {
    for (int s : slots) {
      r.k[l].insert(r.k[l].end(), from.k[l].begin() + s * kRow, from.k[l].begin() + (s + 1) * kRow);
      r.v[l].insert(r.v[l].end(), from.v[l].begin() + s * kRow, from.v[l].begin() + (s + 1) * kRow);
    }
  }
  return r;
}

// One step writing `rows` (every layer) and attending with `q`
// ([layer][tokens][kQHeads][kHeadDim]); returns the outputs of every layer.
inline std::vector<float> Step(PagedKvStore* store, const Rows& rows, const std::vector<float>& q,
                        int first_position) {
  const int n = rows.num_tokens();
  std::vector<StepToken> meta;
  for (int i = 0; i < n; ++i) meta.push_back({7, first_position + i, 0, Role::kUser});
  EXPECT_TRUE(store->BeginStep(meta).ok());
  const size_t per_layer = static_cast<size_t>(n) * kQHeads * kHeadDim;
  std::vector<float> out(kLayers * per_layer);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(store->Append(l, rows.k[l].data(), rows.v[l].data()).ok());
    const absl::Status st =
        store->Attend(l, kQHeads, q.data() + l * per_layer, out.data() + l * per_layer);
    EXPECT_TRUE(st.ok()) << st;
  }
  EXPECT_TRUE(store->EndStep().ok());
  return out;
}

inline std::vector<float> RandomQ(int n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 2.0f);  // peaked, model-like attention
  std::vector<float> q(static_cast<size_t>(kLayers) * n * kQHeads * kHeadDim);
  for (float& x : q) x = dist(rng);
  return q;
}

using kernels::testing::RelL2;  // one definition for the kernel and store tests

}  // namespace polykv::worker::testing
