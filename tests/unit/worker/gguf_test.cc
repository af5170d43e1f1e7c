// GGUF reader and dequantization, on small files the test writes itself (no
// model needed): metadata round trip, each supported tensor type against
// hand-computed values, and clear errors for wrong or truncated files.
#include "client/worker/gguf.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace polykv::worker {
namespace {

// Writes GGUF v3 files field by field.
class GgufWriter {
 public:
  template <typename T>
  void Put(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    meta_.append(p, sizeof(T));
  }
  void PutStr(const std::string& s) {
    Put<uint64_t>(s.size());
    meta_ += s;
  }
  void KvString(const std::string& k, const std::string& v) {
    PutStr(k); Put<uint32_t>(8); PutStr(v); ++num_kv_;
  }
  void KvU32(const std::string& k, uint32_t v) { PutStr(k); Put<uint32_t>(4); Put(v); ++num_kv_; }
  void KvF32(const std::string& k, float v) { PutStr(k); Put<uint32_t>(6); Put(v); ++num_kv_; }
  void KvBool(const std::string& k, bool v) { PutStr(k); Put<uint32_t>(7); Put<uint8_t>(v); ++num_kv_; }
  void KvStrings(const std::string& k, const std::vector<std::string>& v) {
    PutStr(k); Put<uint32_t>(9); Put<uint32_t>(8); Put<uint64_t>(v.size());
    for (const auto& s : v) PutStr(s);
    ++num_kv_;
  }
  void KvI32s(const std::string& k, const std::vector<int32_t>& v) {
    PutStr(k); Put<uint32_t>(9); Put<uint32_t>(5); Put<uint64_t>(v.size());
    for (int32_t x : v) Put(x);
    ++num_kv_;
  }
  void Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
              const std::string& bytes) {
    while (data_.size() % 32 != 0) data_.push_back('\0');  // Align the start.
    tensors_.push_back({name, dims, type, data_.size()});
    data_ += bytes;
  }
  std::string Build() const {
    GgufWriter h;
    h.meta_ = "GGUF";
    h.Put<uint32_t>(3);
    h.Put<uint64_t>(tensors_.size());
    h.Put<uint64_t>(num_kv_);
    std::string out = h.meta_ + meta_;
    GgufWriter t;
    for (const auto& ti : tensors_) {
      t.PutStr(ti.name);
      t.Put<uint32_t>(ti.dims.size());
      for (uint64_t d : ti.dims) t.Put(d);
      t.Put(ti.type);
      t.Put<uint64_t>(ti.offset);
    }
    out += t.meta_;
    while (out.size() % 32 != 0) out.push_back('\0');
    return out + data_;
  }

 private:
  struct TensorInfo {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    uint64_t offset;
  };
  std::string meta_;
  std::string data_;
  uint64_t num_kv_ = 0;
  std::vector<TensorInfo> tensors_;
};

std::string U16(uint16_t v) { return std::string(reinterpret_cast<const char*>(&v), 2); }

// One block of each quantized type, with the values it must decode to.
std::string Q4_0Block(std::vector<float>* want) {
  std::string b = U16(0x3800);  // d = 0.5
  std::vector<float> w(32);
  for (int j = 0; j < 16; ++j) {
    const int lo = j, hi = 15 - j;
    b.push_back(static_cast<char>(lo | (hi << 4)));
    w[j] = (lo - 8) * 0.5f;
    w[j + 16] = (hi - 8) * 0.5f;
  }
  want->insert(want->end(), w.begin(), w.end());
  return b;
}
std::string Q4_1Block(std::vector<float>* want) {
  std::string b = U16(0x3400) + U16(0xBC00);  // d = 0.25, m = -1
  std::vector<float> w(32);
  for (int j = 0; j < 16; ++j) {
    const int lo = (j * 7) % 16, hi = (j * 3 + 1) % 16;
    b.push_back(static_cast<char>(lo | (hi << 4)));
    w[j] = lo * 0.25f - 1.0f;
    w[j + 16] = hi * 0.25f - 1.0f;
  }
  want->insert(want->end(), w.begin(), w.end());
  return b;
}
std::string Q8_0Block(std::vector<float>* want) {
  std::string b = U16(0x4000);  // d = 2
  for (int j = 0; j < 32; ++j) {
    const int8_t q = static_cast<int8_t>(j * 8 - 128);
    b.push_back(static_cast<char>(q));
    want->push_back(q * 2.0f);
  }
  return b;
}

class GgufTest : public ::testing::Test {
 protected:
  std::string WriteFile(const std::string& bytes) {
    char tmpl[] = "/tmp/polykv_gguf_test_XXXXXX";
    const int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
    paths_.push_back(tmpl);
    return tmpl;
  }
  void TearDown() override {
    for (const auto& p : paths_) std::remove(p.c_str());
  }
  std::vector<std::string> paths_;
};

std::string SampleFile(std::vector<float>* q4_0, std::vector<float>* q4_1,
                       std::vector<float>* q8_0) {
  GgufWriter w;
  w.KvString("general.architecture", "llama");
  w.KvU32("llama.block_count", 30);
  w.KvF32("llama.rope.freq_base", 100000.0f);
  w.KvBool("tokenizer.ggml.add_bos_token", false);
  w.KvStrings("tokenizer.ggml.tokens", {"a", "b", "<|im_end|>"});
  w.KvI32s("tokenizer.ggml.token_type", {1, 1, 3});
  w.Tensor("q4_0", {32, 2}, 2, Q4_0Block(q4_0) + Q4_0Block(q4_0));
  w.Tensor("q4_1", {32}, 3, Q4_1Block(q4_1));
  w.Tensor("q8_0", {32}, 8, Q8_0Block(q8_0));
  w.Tensor("f16", {4}, 1, U16(0x3C00) + U16(0xC000) + U16(0x0001) + U16(0x7C00));
  float f32[2] = {1.5f, -0.25f};
  w.Tensor("f32", {2}, 0, std::string(reinterpret_cast<const char*>(f32), sizeof(f32)));
  w.Tensor("q2_k", {256}, 10, std::string(144, '\0'));  // A type we do not decode.
  return w.Build();
}

TEST_F(GgufTest, ReadsMetadata) {
  std::vector<float> a, b, c;
  auto f = GgufFile::Open(WriteFile(SampleFile(&a, &b, &c)));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetInt("llama.block_count"), 30);
  EXPECT_FLOAT_EQ(static_cast<float>(*(*f)->GetFloat("llama.rope.freq_base")), 100000.0f);
  EXPECT_EQ(*(*f)->GetBool("tokenizer.ggml.add_bos_token"), false);
  auto toks = (*f)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ(**toks, (std::vector<std::string>{"a", "b", "<|im_end|>"}));
  auto types = (*f)->GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ(**types, (std::vector<int64_t>{1, 1, 3}));
  EXPECT_TRUE(absl::IsNotFound((*f)->GetString("nope").status()));
  EXPECT_TRUE(absl::IsInvalidArgument((*f)->GetInt("general.architecture").status()));
}

TEST_F(GgufTest, DequantizesEverySupportedType) {
  std::vector<float> q4_0, q4_1, q8_0, out;
  auto f = GgufFile::Open(WriteFile(SampleFile(&q4_0, &q4_1, &q8_0)));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->ReadF32("q4_0", {32, 2}, &out).ok());
  EXPECT_EQ(out, q4_0);
  ASSERT_TRUE((*f)->ReadF32("q4_1", {32}, &out).ok());
  EXPECT_EQ(out, q4_1);
  ASSERT_TRUE((*f)->ReadF32("q8_0", {32}, &out).ok());
  EXPECT_EQ(out, q8_0);
  ASSERT_TRUE((*f)->ReadF32("f16", {4}, &out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));  // Smallest f16 subnormal.
  EXPECT_TRUE(std::isinf(out[3]));
  ASSERT_TRUE((*f)->ReadF32("f32", {2}, &out).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, -0.25f}));
}

TEST_F(GgufTest, RejectsWrongShapesAndUnsupportedTypes) {
  std::vector<float> a, b, c, out;
  auto f = GgufFile::Open(WriteFile(SampleFile(&a, &b, &c)));
  ASSERT_TRUE(f.ok()) << f.status();
  absl::Status s = (*f)->ReadF32("q4_0", {64}, &out);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("expected [64]"), std::string::npos) << s;
  s = (*f)->ReadF32("q2_k", {256}, &out);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("unsupported type"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsNotFound((*f)->ReadF32("missing", {1}, &out)));
}

TEST_F(GgufTest, EveryTruncationIsAClearError) {
  std::vector<float> a, b, c;
  const std::string full = SampleFile(&a, &b, &c);
  ASSERT_TRUE(GgufFile::Open(WriteFile(full)).ok());
  // Cutting the file anywhere before the end of the last decodable tensor
  // (f32: 8 bytes, then 24 bytes of padding and the unsupported q2_k tensor's
  // 144 bytes, which are never read) must give an error, not a crash.
  const size_t needed = full.size() - 144 - 24;
  for (size_t len = 0; len < needed; len += (len < 400 ? 1 : 7)) {
    auto f = GgufFile::Open(WriteFile(full.substr(0, len)));
    EXPECT_FALSE(f.ok()) << "prefix of " << len << " bytes opened";
    if (!f.ok()) {
      EXPECT_TRUE(absl::IsDataLoss(f.status()) || absl::IsInvalidArgument(f.status()))
          << f.status();
    }
    std::remove(paths_.back().c_str());
    paths_.pop_back();
  }
}

TEST_F(GgufTest, RejectsWrongFiles) {
  auto f = GgufFile::Open(WriteFile(std::string("NOPE") + std::string(60, '\0')));
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(f.status()));
  EXPECT_NE(f.status().message().find("not a GGUF file"), std::string::npos);

  std::string v9 = "GGUF";
  v9 += std::string("\x09\0\0\0", 4) + std::string(16, '\0');
  f = GgufFile::Open(WriteFile(v9));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("unsupported GGUF version 9"), std::string::npos)
      << f.status();

  f = GgufFile::Open("/nonexistent/polykv/model.gguf");
  EXPECT_TRUE(absl::IsNotFound(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("fetch-model.sh"), std::string::npos);
}

TEST(DequantizeTest, RejectsPartialBlocks) {
  std::vector<float> out(16);
  const std::string block(18, '\0');
  EXPECT_TRUE(absl::IsInvalidArgument(Dequantize(2, block.data(), 16, out.data())));
  EXPECT_TRUE(absl::IsInvalidArgument(Dequantize(99, block.data(), 32, out.data())));
}

}  // namespace
}  // namespace polykv::worker
