#include "client/worker/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace polykv::worker {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian.
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr uint64_t kMaxArrayElems = 1ull << 28;
constexpr uint32_t kMaxDims = 4;

enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32v = 6,
  kBool = 7, kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Sequential reader over the mapping; every read is bounds-checked.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}
  size_t pos() const { return pos_; }

  absl::Status Truncated(const char* what) const {
    return absl::DataLossError(absl::StrCat(path_, ": truncated GGUF file (",
                                            size_, " bytes) while reading ",
                                            what, " at offset ", pos_));
  }
  template <typename T>
  absl::Status Read(T* v, const char* what) {
    if (size_ - pos_ < sizeof(T)) return Truncated(what);
    std::memcpy(v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status ReadString(std::string* s, const char* what) {
    uint64_t n{};
    if (auto st = Read(&n, what); !st.ok()) return st;
    if (n > kMaxStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": implausible string length ", n, " at offset ", pos_,
          " (not a GGUF file, or corrupt)"));
    }
    if (size_ - pos_ < n) return Truncated(what);
    s->assign(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return absl::OkStatus();
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

#define RETURN_IF_ERROR_(expr)             \
  do {                                     \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

absl::Status ReadScalar(Cursor& c, uint32_t type, GgufValue::Value* out,
                        const std::string& path) {
  switch (type) {
    case kU8: { uint8_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "u8")); *out = uint64_t{v}; return absl::OkStatus(); }
    case kI8: { int8_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "i8")); *out = int64_t{v}; return absl::OkStatus(); }
    case kU16: { uint16_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "u16")); *out = uint64_t{v}; return absl::OkStatus(); }
    case kI16: { int16_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "i16")); *out = int64_t{v}; return absl::OkStatus(); }
    case kU32: { uint32_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "u32")); *out = uint64_t{v}; return absl::OkStatus(); }
    case kI32: { int32_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "i32")); *out = int64_t{v}; return absl::OkStatus(); }
    case kU64: { uint64_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "u64")); *out = v; return absl::OkStatus(); }
    case kI64: { int64_t v = 0; RETURN_IF_ERROR_(c.Read(&v, "i64")); *out = v; return absl::OkStatus(); }
    case kF32v: { float v = 0; RETURN_IF_ERROR_(c.Read(&v, "f32")); *out = double{v}; return absl::OkStatus(); }
    case kF64: { double v = 0; RETURN_IF_ERROR_(c.Read(&v, "f64")); *out = v; return absl::OkStatus(); }
    case kBool: {
      uint8_t v{};
      RETURN_IF_ERROR_(c.Read(&v, "bool"));
      *out = v != 0;
      return absl::OkStatus();
    }
    case kString: {
      std::string s;
      RETURN_IF_ERROR_(c.ReadString(&s, "string value"));
      *out = std::move(s);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": unknown GGUF metadata value type ", type, " at offset ", c.pos()));
  }
}

absl::Status ReadValue(Cursor& c, uint32_t type, GgufValue* out,
                       const std::string& path) {
  if (type != kArray) {
    out->type = type;
    return ReadScalar(c, type, &out->value, path);
  }
  uint32_t elem_type{};
  uint64_t n{};
  RETURN_IF_ERROR_(c.Read(&elem_type, "array type"));
  RETURN_IF_ERROR_(c.Read(&n, "array length"));
  if (n > kMaxArrayElems) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": implausible array length ", n));
  }
  out->type = elem_type;
  if (elem_type == kString) {
    std::vector<std::string> v(n);
    for (auto& s : v) RETURN_IF_ERROR_(c.ReadString(&s, "string array"));
    out->value = std::move(v);
    return absl::OkStatus();
  }
  if (elem_type == kArray) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": nested GGUF arrays are not supported"));
  }
  const bool is_float = elem_type == kF32v || elem_type == kF64;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  for (uint64_t i = 0; i < n; ++i) {
    GgufValue::Value v;
    RETURN_IF_ERROR_(ReadScalar(c, elem_type, &v, path));
    if (is_float) {
      floats.push_back(std::get<double>(v));
    } else if (auto* u = std::get_if<uint64_t>(&v)) {
      ints.push_back(static_cast<int64_t>(*u));
    } else if (auto* s = std::get_if<int64_t>(&v)) {
      ints.push_back(*s);
    } else {
      ints.push_back(std::get<bool>(v) ? 1 : 0);
    }
  }
  if (is_float) {
    out->value = std::move(floats);
  } else {
    out->value = std::move(ints);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return err == ENOENT
               ? absl::NotFoundError(absl::StrCat(path, ": no such file (run scripts/fetch-model.sh)"))
               : absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 24) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": ", f->size_,
                                            " bytes is too short for a GGUF header"));
  }
  void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap: ", std::strerror(errno)));
  }
  f->base_ = static_cast<const uint8_t*>(m);
  if (absl::Status s = f->Parse(); !s.ok()) return s;
  return f;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_, path_);
  uint32_t magic{};
  RETURN_IF_ERROR_(c.Read(&magic, "magic"));
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": not a GGUF file (bad magic)"));
  }
  RETURN_IF_ERROR_(c.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": unsupported GGUF version ", version_, " (supported: 2, 3)"));
  }
  uint64_t num_tensors = 0, num_kv = 0;
  RETURN_IF_ERROR_(c.Read(&num_tensors, "tensor count"));
  RETURN_IF_ERROR_(c.Read(&num_kv, "metadata count"));
  if (num_tensors > (1u << 20) || num_kv > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": implausible counts (", num_tensors, " tensors, ", num_kv, " keys)"));
  }
  for (uint64_t i = 0; i < num_kv; ++i) {
    std::string key;
    uint32_t type{};
    RETURN_IF_ERROR_(c.ReadString(&key, "metadata key"));
    RETURN_IF_ERROR_(c.Read(&type, "metadata type"));
    GgufValue v;
    RETURN_IF_ERROR_(ReadValue(c, type, &v, path_));
    metadata_[key] = std::move(v);
  }
  std::vector<GgufTensorInfo> infos(num_tensors);
  for (auto& t : infos) {
    uint32_t nd{};
    RETURN_IF_ERROR_(c.ReadString(&t.name, "tensor name"));
    RETURN_IF_ERROR_(c.Read(&nd, "tensor rank"));
    if (nd == 0 || nd > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": tensor ", t.name, " has rank ", nd));
    }
    t.num_elements = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      uint64_t dim{};
      RETURN_IF_ERROR_(c.Read(&dim, "tensor dim"));
      if (dim == 0 || dim > (1ull << 32)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path_, ": tensor ", t.name, " has dimension ", dim));
      }
      t.dims.push_back(static_cast<int64_t>(dim));
      t.num_elements *= static_cast<int64_t>(dim);
    }
    RETURN_IF_ERROR_(c.Read(&t.type, "tensor type"));
    RETURN_IF_ERROR_(c.Read(&t.offset, "tensor offset"));
  }
  uint64_t alignment = 32;
  if (auto a = GetInt("general.alignment"); a.ok()) {
    if (*a <= 0 || (*a & (*a - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": general.alignment ", *a, " is not a power of two"));
    }
    alignment = static_cast<uint64_t>(*a);
  }
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  for (auto& t : infos) {
    int be, bb;
    if (GgmlBlockInfo(t.type, &be, &bb)) {
      if (t.dims[0] % be != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            path_, ": tensor ", t.name, " row of ", t.dims[0],
            " is not a multiple of the ", GgmlTypeName(t.type), " block"));
      }
      t.num_bytes = static_cast<size_t>(t.num_elements / be * bb);
      if (data_start + t.offset > size_ || size_ - data_start - t.offset < t.num_bytes) {
        return absl::DataLossError(absl::StrCat(
            path_, ": truncated GGUF file: tensor ", t.name, " needs bytes up to ",
            data_start + t.offset + t.num_bytes, " but the file has ", size_));
      }
      t.data = base_ + data_start + t.offset;
    }  // Unknown types are listed but have no data; Tensor users check.
    tensors_[t.name] = std::move(t);
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
absl::Status Missing(const std::string& path, const std::string& key) {
  return absl::NotFoundError(absl::StrCat(path, ": metadata key ", key, " is missing"));
}
absl::Status WrongType(const std::string& path, const std::string& key,
                       const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": metadata key ", key, " is not ", want));
}
}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (auto* s = std::get_if<std::string>(&v->value)) return *s;
  return WrongType(path_, key, "a string");
}

absl::StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (auto* u = std::get_if<uint64_t>(&v->value)) return static_cast<int64_t>(*u);
  if (auto* i = std::get_if<int64_t>(&v->value)) return *i;
  return WrongType(path_, key, "an integer");
}

absl::StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (auto* d = std::get_if<double>(&v->value)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v->value)) return static_cast<double>(*u);
  if (auto* i = std::get_if<int64_t>(&v->value)) return static_cast<double>(*i);
  return WrongType(path_, key, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (auto* b = std::get_if<bool>(&v->value)) return *b;
  return WrongType(path_, key, "a bool");
}

absl::StatusOr<const std::vector<std::string>*> GgufFile::GetStringArray(
    const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (auto* a = std::get_if<std::vector<std::string>>(&v->value)) return a;
  return WrongType(path_, key, "an array of strings");
}

absl::StatusOr<const std::vector<int64_t>*> GgufFile::GetIntArray(
    const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(path_, key);
  if (auto* a = std::get_if<std::vector<int64_t>>(&v->value)) return a;
  return WrongType(path_, key, "an array of integers");
}

absl::StatusOr<const GgufTensorInfo*> GgufFile::Tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor ", name, " is missing"));
  }
  if (it->second.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has unsupported type ",
        GgmlTypeName(it->second.type), " (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q8_k)"));
  }
  return &it->second;
}

absl::Status GgufFile::ReadF32(const std::string& name,
                               const std::vector<int64_t>& dims,
                               std::vector<float>* out) const {
  absl::StatusOr<const GgufTensorInfo*> t = Tensor(name);
  if (!t.ok()) return t.status();
  if ((*t)->dims != dims) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor ", name, " has dims [", absl::StrJoin((*t)->dims, ", "),
        "], expected [", absl::StrJoin(dims, ", "), "]"));
  }
  out->resize((*t)->num_elements);
  return Dequantize((*t)->type, (*t)->data, (*t)->num_elements, out->data());
}

}  // namespace polykv::worker
