#include "client/worker/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "client/worker/json.h"

namespace polykv::worker {
namespace {

double LogSumExp(std::span<const float> logits) {
  const float top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - top));
  return top + std::log(sum);
}

// Below this the reference's rest-of-vocabulary mass is the rounding of its
// float log-probabilities, not mass.
constexpr double kTailFloor = 1e-6;

}  // namespace

TopLogprobs TopK(std::span<const float> logits, int k) {
  TopLogprobs out;
  if (logits.empty() || k <= 0) return out;
  const size_t n = std::min(logits.size(), static_cast<size_t>(k));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  // Ties go to the lower id, as the greedy sampler's argmax does.
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  const double lse = LogSumExp(logits);
  out.ids.assign(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n));
  for (int32_t id : out.ids) out.logprobs.push_back(static_cast<float>(logits[id] - lse));
  return out;
}

ForcedStep ScoreStep(const TopLogprobs& reference, int32_t target, std::span<const float> logits) {
  ForcedStep s;
  if (logits.empty()) return s;
  const double lse = LogSumExp(logits);
  double p_top = 0, q_top = 0, kl = 0;
  for (size_t i = 0; i < reference.ids.size(); ++i) {
    const int32_t id = reference.ids[i];
    if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
    const double lp = reference.logprobs[i];
    const double lq = logits[id] - lse;
    const double p = std::exp(lp);
    p_top += p;
    q_top += std::exp(lq);
    kl += p * (lp - lq);
  }
  const double p_tail = 1.0 - p_top;
  if (p_tail > kTailFloor) {
    const double q_tail = std::max(1.0 - q_top, 1e-300);
    kl += p_tail * (std::log(p_tail) - std::log(q_tail));
  }
  s.kl = std::max(0.0, kl);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  s.top1 = !reference.ids.empty() && argmax == reference.ids[0];
  if (target >= 0 && static_cast<size_t>(target) < logits.size()) {
    s.target_logprob = logits[target] - lse;
  }
  return s;
}

void ForcedSummary::Add(const ForcedStep& s) {
  ++positions;
  kl_sum += s.kl;
  kl_max = std::max(kl_max, s.kl);
  target_logprob_sum += s.target_logprob;
  top1 += s.top1 ? 1 : 0;
}

std::string ReferenceTurnJson(const ReferenceTurn& turn) {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> lps;
  for (const TopLogprobs& t : turn.top) {
    ids.push_back(t.ids);
    lps.push_back(t.logprobs);
  }
  return DumpJson(
      {{"id", turn.id}, {"targets", turn.targets}, {"top_ids", ids}, {"top_logprobs", lps}});
}

absl::StatusOr<ReferenceTurn> ParseReferenceTurn(const std::string& line) {
  auto v = ParseJson(line);
  if (!v.ok()) return v.status();
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("reference turn: ", what));
  };
  if (!v->is_object()) return bad("expected a JSON object");
  for (const char* key : {"targets", "top_ids", "top_logprobs"}) {
    auto it = v->find(key);
    if (it == v->end() || !it->is_array()) {
      return bad(absl::StrCat("\"", key, "\" must be an array"));
    }
  }
  ReferenceTurn t;
  if (auto it = v->find("id"); it != v->end() && it->is_string()) t.id = it->get<std::string>();
  try {
    t.targets = (*v)["targets"].get<std::vector<int32_t>>();
    const auto ids = (*v)["top_ids"].get<std::vector<std::vector<int32_t>>>();
    const auto lps = (*v)["top_logprobs"].get<std::vector<std::vector<float>>>();
    if (ids.size() != t.targets.size() || lps.size() != t.targets.size()) {
      return bad(absl::StrCat(t.targets.size(), " targets but ", ids.size(), " top_ids and ",
                              lps.size(), " top_logprobs rows"));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i].size() != lps[i].size()) {
        return bad(absl::StrCat("row ", i, ": ", ids[i].size(), " ids but ", lps[i].size(),
                                " log-probabilities"));
      }
      t.top.push_back({ids[i], lps[i]});
    }
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  if (t.targets.empty()) return bad("no targets");
  return t;
}

}  // namespace polykv::worker
