// GGUF reader: metadata and tensors of a llama.cpp model file, memory-mapped.
//
// Supports GGUF versions 2 and 3, all metadata value types, and tensors of
// types F32, F16, Q4_0, Q4_1 and Q8_0 (the ones dequantized here). Every
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

namespace polykv::worker {

// Tensor element types; wire values are GGML's.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
};

// Name for messages ("q4_1"); "type#N" for types this reader does not know.
std::string GgmlTypeName(uint32_t type);

// Elements per quantization block and bytes per block; false for unsupported
// types.
bool GgmlBlockInfo(uint32_t type, int* block_elems, int* block_bytes);

// Dequantizes `n` elements (n a multiple of the type's block size) from `src`
// to f32. REQUIRES: `src` holds n / block_elems * block_bytes bytes.
absl::Status Dequantize(uint32_t type, const void* src, int64_t n, float* dst);

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
