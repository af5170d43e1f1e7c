// What a test does when an input it reads — a model file, evaluation data, a
// binary of the build — is absent: outside CI it skips, naming the command
// that fetches the input; under CI it fails with the same message, because
// the test command fetches every input first and a skip there would hide a
// missing install step (a green run on a warm machine once did).
//
//   if (model == nullptr) POLYKV_MISSING_INPUT() << "run scripts/fetch-model.sh x";
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace polykv::testing {

// True when the CI environment variable is set to anything but "", "0" or
// "false" (scripts/test.sh sets it, as CI services do).
inline bool InputsRequired() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string_view v(ci);
  return !v.empty() && v != "0" && v != "false";
}

inline const char* MissingInputHeader() {
  return InputsRequired() ? "Missing test input (CI is set: a missing input fails)"
                          : "Missing test input (skipped; under CI it fails)";
}

inline ::testing::TestPartResult::Type MissingInputResult() {
  return InputsRequired() ? ::testing::TestPartResult::kFatalFailure
                          : ::testing::TestPartResult::kSkip;
}

}  // namespace polykv::testing

// GTEST_SKIP() and GTEST_FAIL() are both this macro with a fixed result type;
// here the type depends on InputsRequired(). Returns from the test body.
#define POLYKV_MISSING_INPUT()                                                     \
  return GTEST_MESSAGE_(::polykv::testing::MissingInputHeader(),                   \
                        ::polykv::testing::MissingInputResult())
