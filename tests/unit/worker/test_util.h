// Shared helpers for the worker tests: the model (loaded once per test
// binary) and the fixture files.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/worker/conversation.h"
#include "client/worker/json.h"
#include "gtest/gtest.h"
#include "tests/missing_input.h"

namespace polykv::worker::testing {

// A model (a scripts/fetch-model.sh name or a path) loaded once per name and
// decode numerics; nullptr when the file is absent.
inline const LoadedModel* SharedModelFor(const std::string& name, Activations decode) {
  static auto* models = new std::map<std::pair<std::string, int>, const LoadedModel*>();
  const auto key = std::make_pair(name, static_cast<int>(decode));
  if (auto it = models->find(key); it != models->end()) return it->second;
  const LoadedModel* loaded = nullptr;
  auto path = ModelPath(name);
  if (path.ok() && std::ifstream(*path).good()) {
    ModelLoadOptions o;
    o.decode = decode;
    auto m = LoadModel(*path, o);
    if (m.ok()) {
      loaded = m->release();
    } else {
      ADD_FAILURE() << "loading " << *path << ": " << m.status();
    }
  }
  (*models)[key] = loaded;
  return loaded;
}

// The fast-test model ($POLYKV_MODEL_PATH or SmolLM2) with exact (f32)
// decode numerics, so decode steps and prefill compute the same function:
// the tests of cache properties compare the two.
inline const LoadedModel* SharedModel() {
  return SharedModelFor(DefaultModelPath(), Activations::kF32);
}

// A dense local cache of the model's shape.
inline std::unique_ptr<LocalKvStore> NewLocalStore(const LlamaModel& m) {
  LocalKvStoreOptions o;
  o.shape = m.config().kv_shape();
  auto s = LocalKvStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// A model by name with the worker's default (int8-activation) decode.
inline const LoadedModel* SharedModelNamed(const std::string& name) {
  return SharedModelFor(name, ModelLoadOptions().decode);
}

// Skips the test unless the named model is present (binds `model`).
#define POLYKV_REQUIRE_MODEL_NAMED(NAME)                                           \
  const ::polykv::worker::LoadedModel* model =                                     \
      ::polykv::worker::testing::SharedModelNamed(NAME);                           \
  if (model == nullptr) {                                                          \
    POLYKV_MISSING_INPUT() << "model " << (NAME) << " is absent: run scripts/fetch-model.sh " \
                 << (NAME);                                                        \
  }

#define POLYKV_REQUIRE_MODEL()                                                     \
  const ::polykv::worker::LoadedModel* model =                                     \
      ::polykv::worker::testing::SharedModel();                                    \
  if (model == nullptr) {                                                          \
    POLYKV_MISSING_INPUT() << "model file " << ::polykv::worker::DefaultModelPath()          \
                 << " is absent: run scripts/fetch-model.sh (or set POLYKV_MODEL_PATH)"; \
  }

// Rows of a JSONL fixture in tests/fixtures/worker/.
inline std::vector<JsonValue> ReadFixture(const std::string& name) {
  std::vector<JsonValue> rows;
  std::ifstream in(std::string(POLYKV_WORKER_FIXTURES) + "/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto v = ParseJson(line);
    EXPECT_TRUE(v.ok()) << name << ": " << v.status();
    if (v.ok()) rows.push_back(std::move(*v));
  }
  return rows;
}

inline const JsonValue& Field(const JsonValue& row, const std::string& key) {
  static const JsonValue kNull;
  auto it = row.find(key);
  return it == row.end() ? kNull : *it;
}

inline std::vector<int32_t> IntArray(const JsonValue& v) {
  std::vector<int32_t> out;
  for (const JsonValue& e : v) {
    out.push_back(static_cast<int32_t>(e.get<double>()));
  }
  return out;
}

inline std::vector<double> NumArray(const JsonValue& v) {
  std::vector<double> out;
  for (const JsonValue& e : v) {
    out.push_back(e.get<double>());
  }
  return out;
}

}  // namespace polykv::worker::testing
