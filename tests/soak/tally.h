// Tally: what the soak's agents did, and every error they met by "Rpc:CODE",
// split into the expected ones (provoked on purpose) and the rest.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace polykv::testing {

// Counts of everything the agents did, and of every error by "Rpc:CODE".
// Thread-safety: all methods are thread-safe.
class Tally {
 public:
  void Add(const std::string& what, uint64_t n = 1) {
    absl::MutexLock lock(&mu_);
    counts_[what] += n;
  }
  // An error; `expected` says whether the soak provokes it on purpose.
  void Error(const std::string& rpc, const absl::Status& s, bool expected) {
    absl::MutexLock lock(&mu_);
    const std::string key = absl::StrCat(rpc, ":", absl::StatusCodeToString(s.code()));
    errors_[key] += 1;
    if (!expected) {
      unexpected_[key] += 1;
      if (first_unexpected_.size() < 10)
        first_unexpected_.push_back(absl::StrCat(key, " ", s.message()));
    }
  }
  uint64_t Get(const std::string& what) {
    absl::MutexLock lock(&mu_);
    return counts_[what];
  }
  std::string Json(const std::map<std::string, uint64_t>& m) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : m) parts.push_back(absl::StrCat("\"", k, "\":", v));
    return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
  }
  std::string CountsJson() {
    absl::MutexLock lock(&mu_);
    return Json(counts_);
  }
  std::string ErrorsJson() {
    absl::MutexLock lock(&mu_);
    return Json(errors_);
  }
  std::string UnexpectedJson() {
    absl::MutexLock lock(&mu_);
    return Json(unexpected_);
  }
  uint64_t NumUnexpected() {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [k, v] : unexpected_) n += v;
    return n;
  }
  std::vector<std::string> FirstUnexpected() {
    absl::MutexLock lock(&mu_);
    return first_unexpected_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> unexpected_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> first_unexpected_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::testing
