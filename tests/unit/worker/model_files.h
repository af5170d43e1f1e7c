// The model files of scripts/fetch-model.sh for tests that read tensors
// directly (no LoadModel): opened by name, or the test is skipped naming the
// command that fetches them.
#pragma once

#include <memory>
#include <string>

#include "client/worker/conversation.h"
#include "client/worker/gguf.h"
#include "gtest/gtest.h"
#include "tests/missing_input.h"

namespace polykv::worker::testing {

// The GGUF of `name` (a fetch-model.sh name), or nullptr when it is absent.
inline std::shared_ptr<const GgufFile> OpenModelFile(const std::string& name) {
  auto path = ModelPath(name);
  if (!path.ok()) return nullptr;
  auto f = GgufFile::Open(*path);
  if (!f.ok()) return nullptr;
  return std::shared_ptr<const GgufFile>(std::move(*f));
}

}  // namespace polykv::worker::testing

// Binds `var` to the GGUF of NAME, or skips the test naming the fetch command.
#define POLYKV_REQUIRE_MODEL_FILE(var, NAME)                                         \
  const std::shared_ptr<const ::polykv::worker::GgufFile> var =                      \
      ::polykv::worker::testing::OpenModelFile(NAME);                                \
  if (var == nullptr) {                                                              \
    POLYKV_MISSING_INPUT() << (NAME) << " is absent: run scripts/fetch-model.sh " << (NAME);   \
  }
