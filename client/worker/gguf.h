// GGUF reader: metadata and tensors of a llama.cpp model file, memory-mapped.
//
// Supports GGUF versions 2 and 3, all metadata value types, and tensors of
// the types weights/ggml_types.h knows (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K). Every
// offset and size read from the file is bounds-checked, so a wrong or
// truncated file gives an InvalidArgument/DataLoss status with the file name,
// never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/worker/weights/ggml_types.h"

namespace polykv::worker {

// A metadata value. Arrays keep their element type; arrays of strings become
// std::vector<std::string>, numeric arrays are widened to int64 or double.
struct GgufValue {
  using Value = std::variant<uint64_t, int64_t, double, bool, std::string,
                             std::vector<std::string>, std::vector<int64_t>,
                             std::vector<double>>;
  uint32_t type = 0;  // GGUF value type of the scalar or of the array element.
  Value value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // dims[0] is the contiguous (fastest) dimension.
  uint32_t type = 0;
  uint64_t offset = 0;        // From the start of the data section.
  int64_t num_elements = 0;
  size_t num_bytes = 0;
  const uint8_t* data = nullptr;  // Into the mapping; valid while the file lives.
};

// A mapped GGUF file. Immutable after Open; thread-safe for concurrent reads.
class GgufFile {
 public:
  // Maps `path` and parses its header, metadata and tensor table.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }

  const GgufValue* Find(const std::string& key) const;
  // Typed getters: NotFound when absent, InvalidArgument on a type mismatch.
  absl::StatusOr<std::string> GetString(const std::string& key) const;
  absl::StatusOr<int64_t> GetInt(const std::string& key) const;
  absl::StatusOr<double> GetFloat(const std::string& key) const;
  absl::StatusOr<bool> GetBool(const std::string& key) const;
  absl::StatusOr<const std::vector<std::string>*> GetStringArray(
      const std::string& key) const;
  absl::StatusOr<const std::vector<int64_t>*> GetIntArray(
      const std::string& key) const;

  const std::map<std::string, GgufTensorInfo>& tensors() const { return tensors_; }
  absl::StatusOr<const GgufTensorInfo*> Tensor(const std::string& name) const;

  // Dequantizes a whole tensor to f32, checking that its dims equal `dims`.
  // `out` is resized to the element count.
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& dims,
                       std::vector<float>* out) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensorInfo> tensors_;
};

}  // namespace polykv::worker
