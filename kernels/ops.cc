// Dispatch for kernels/ops.h: validates arguments once (shapes, formats, block
// tables when they are host-readable), then calls the chosen implementation.
#include "kernels/ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu.h"
#include "kernels/device.h"
#include "kernels/numeric.h"
#include "kernels/ref/ref.h"
#if POLYKV_KERNELS_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace polykv::kernels {
namespace {

constexpr int kMaxBlockTokens = 256;

absl::Status CheckShape(const PageShape& s) {
  if (s.block_tokens <= 0 || s.block_tokens > kMaxBlockTokens || s.num_kv_heads <= 0 ||
      s.head_dim <= 0 || s.head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad page shape: block_tokens=", s.block_tokens, " (1..", kMaxBlockTokens,
        "), num_kv_heads=", s.num_kv_heads, ", head_dim=", s.head_dim, " (1..", kMaxHeadDim, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckFormat(const PageShape& s, PageFormat f, KvKind kind) {
  if (!IsValidFormat(int(f))) {
    return absl::InvalidArgumentError(absl::StrCat("invalid page format ", int(f)));
  }
  if (!GeomOf(s).Supports(f, kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(FormatShortName(f)), " ", kind == KvKind::kKey ? "key" : "value",
        " pages need head_dim a multiple of 8 (int4/int2) and of ", kValueGroup,
        " (scaled value formats); head_dim=", s.head_dim));
  }
  return absl::OkStatus();
}

absl::Status CheckBackend(const Exec& exec) {
  switch (exec.backend) {
    case Backend::kReference:
    case Backend::kCpu:
      return absl::OkStatus();
    case Backend::kCuda:
      if (!CudaBuilt()) return absl::FailedPreconditionError("polykv_kernels built without CUDA");
      if (CudaDeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown backend ", int(exec.backend)));
  }
}

// Checks a view's geometry; on host backends also every block's formats.
template <typename View>
absl::Status CheckView(const Exec& exec, const View& kv, const char* what) {
  if (absl::Status st = CheckShape(kv.shape); !st.ok()) return st;
  if (kv.num_tokens <= 0 || kv.blocks == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty view (num_tokens=",
                                                   kv.num_tokens, ")"));
  }
  const int need = (kv.num_tokens + kv.shape.block_tokens - 1) / kv.shape.block_tokens;
  if (kv.num_blocks != need) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_blocks=", kv.num_blocks,
                                                   " but num_tokens=", kv.num_tokens, " needs ",
                                                   need));
  }
  if (exec.backend == Backend::kCuda) return absl::OkStatus();  // table is in device memory
  for (int b = 0; b < kv.num_blocks; ++b) {
    const BlockEntry& e = kv.blocks[b];
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      const PageFormat f = kind == KvKind::kKey ? e.k_format : e.v_format;
      if (absl::Status st = CheckFormat(kv.shape, f, kind); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(what, " block ", b, ": ", st.message()));
      }
    }
    if (!kv.base && (e.k_offset == 0 || e.v_offset == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " block ", b, ": null page"));
    }
  }
  return absl::OkStatus();
}

#if POLYKV_KERNELS_WITH_CUDA
absl::Status FromCuda(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", err, " (",
                                          cuda::ErrorString(err), ")"));
}
#define POLYKV_CUDA_CALL(what, call) return FromCuda((call), what)
#else
#define POLYKV_CUDA_CALL(what, call) \
  return absl::FailedPreconditionError("polykv_kernels built without CUDA")
#endif

absl::Status PagesImpl(const Exec& exec, const PageShape& shape, KvKind kind, PageFormat format,
                       const void* in, int num_pages, int rows, bool quantize, SourceType src_type,
                       void* out) {
  if (absl::Status st = CheckBackend(exec); !st.ok()) return st;
  if (absl::Status st = CheckShape(shape); !st.ok()) return st;
  if (absl::Status st = CheckFormat(shape, format, kind); !st.ok()) return st;
  if (in == nullptr || out == nullptr || num_pages < 0) {
    return absl::InvalidArgumentError("null buffer or negative page count");
  }
  if (rows <= 0 || rows > shape.block_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens=", rows, " outside 1..block_tokens=", shape.block_tokens));
  }
  if (src_type != SourceType::kF32 && src_type != SourceType::kF16) {
    return absl::InvalidArgumentError("bad source type");
  }
  if (num_pages == 0) return absl::OkStatus();
  switch (exec.backend) {
    case Backend::kReference:
      if (quantize) {
        ref::QuantizePages(shape, kind, format, in, src_type, num_pages, rows, out);
      } else {
        ref::DequantizePages(shape, kind, format, in, num_pages, rows, static_cast<float*>(out));
      }
      return absl::OkStatus();
    case Backend::kCpu:
      if (quantize) {
        cpu::QuantizePages(exec.num_threads, shape, kind, format, in, src_type, num_pages, rows,
                           out);
      } else {
        cpu::DequantizePages(exec.num_threads, shape, kind, format, in, num_pages, rows,
                             static_cast<float*>(out));
      }
      return absl::OkStatus();
    case Backend::kCuda:
      if (quantize) {
        POLYKV_CUDA_CALL("quantize", cuda::QuantizePages(exec.cuda_stream, shape, kind, format, in,
                                                         src_type, num_pages, rows, out));
      } else {
        POLYKV_CUDA_CALL("dequantize",
                         cuda::DequantizePages(exec.cuda_stream, shape, kind, format, in,
                                               num_pages, rows, static_cast<float*>(out)));
      }
    default:
      return absl::InvalidArgumentError("unknown backend");
  }
}

absl::Status AttentionImpl(const Exec& exec, const PagedKvView& kv, const AttentionParams& p,
                           int num_queries, const float* q, float* out, float* lse,
                           float* slot_mass) {
  if (absl::Status st = CheckBackend(exec); !st.ok()) return st;
  if (absl::Status st = CheckView(exec, kv, "kv"); !st.ok()) return st;
  if (p.num_q_heads <= 0 || p.num_q_heads % kv.shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads=", p.num_q_heads,
                                                   " is not a positive multiple of num_kv_heads=",
                                                   kv.shape.num_kv_heads));
  }
  if (num_queries < 1 || num_queries > kv.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_new=", num_queries, " outside 1..",
                                                   kv.num_tokens));
  }
  if (q == nullptr || out == nullptr) return absl::InvalidArgumentError("null q or out");
  if (p.mass_reduce != MassReduce::kSum && p.mass_reduce != MassReduce::kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("mass_reduce=", static_cast<int>(p.mass_reduce), " unknown"));
  }
  if (!(p.sm_scale >= 0.0f) || std::isinf(p.sm_scale)) {
    return absl::InvalidArgumentError("sm_scale must be finite and >= 0");
  }
  if (p.slot_bias != nullptr && exec.backend != Backend::kCuda) {
    // One pass over num_tokens floats (the attention reads num_tokens K and V
    // rows per head): a NaN or infinite bias would poison or zero the softmax.
    for (int s = 0; s < kv.num_tokens; ++s) {
      if (!std::isfinite(p.slot_bias[s])) {
        return absl::InvalidArgumentError(
            absl::StrCat("slot_bias[", s, "] = ", p.slot_bias[s], " is not finite"));
      }
    }
  }
  const float scale = p.sm_scale > 0.0f ? p.sm_scale : 1.0f / std::sqrt(float(kv.shape.head_dim));
  switch (exec.backend) {
    case Backend::kReference:
      ref::Attention(kv, p.num_q_heads, scale, p.slot_bias, num_queries, q, out, lse, slot_mass,
                     p.mass_reduce);
      return absl::OkStatus();
    case Backend::kCpu:
      cpu::Attention(exec.num_threads, kv, p.num_q_heads, scale, p.slot_bias, num_queries, q, out,
                     lse, slot_mass, p.mass_reduce);
      return absl::OkStatus();
    case Backend::kCuda:
      if (slot_mass != nullptr && num_queries > 1) {
        return absl::UnimplementedError("prefill attention mass on the CUDA backend");
      }
      POLYKV_CUDA_CALL("attention",
                       cuda::Attention(exec.cuda_stream, kv, p.num_q_heads, scale, p.slot_bias,
                                       num_queries, q, out, lse, slot_mass, p.mass_reduce));
    default:
      return absl::InvalidArgumentError("unknown backend");
  }
}

}  // namespace

std::string_view BackendName(Backend b) {
  switch (b) {
    case Backend::kReference: return "reference";
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "invalid";
}

absl::Status QuantizePage(const Exec& exec, const PageShape& shape, KvKind kind,
                          PageFormat format, const void* src, SourceType src_type,
                          int num_tokens, void* page) {
  return PagesImpl(exec, shape, kind, format, src, 1, num_tokens, true, src_type, page);
}

absl::Status WritePageRows(const PageShape& shape, PageFormat format, const float* src, int row,
                           int num_rows, void* page) {
  if (absl::Status st = CheckShape(shape); !st.ok()) return st;
  if (format != PageFormat::kF32 && format != PageFormat::kF16 && format != PageFormat::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WritePageRows needs a float format (f32/f16/bf16), got format ", int(format)));
  }
  if (src == nullptr || page == nullptr || row < 0 || num_rows < 0 ||
      row + num_rows > shape.block_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("rows [", row, ", ", row + num_rows,
                                                   ") outside the page's ", shape.block_tokens));
  }
  const PageGeom g = GeomOf(shape);
  const int D = g.head_dim;
  for (int r = 0; r < num_rows; ++r) {
    for (int h = 0; h < g.num_kv_heads; ++h) {
      const float* x = src + g.DenseIndex(r, h, 0);
      const size_t i = g.ElemIndex(row + r, h, 0);
      if (format == PageFormat::kF32) {
        std::memcpy(static_cast<float*>(page) + i, x, D * sizeof(float));
      } else {
        uint16_t* dst = static_cast<uint16_t*>(page) + i;
        for (int d = 0; d < D; ++d) {
          dst[d] = format == PageFormat::kF16 ? F32ToF16(x[d]) : F32ToBF16(x[d]);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status QuantizePages(const Exec& exec, const PageShape& shape, KvKind kind,
                           PageFormat format, const void* src, SourceType src_type,
                           int num_pages, void* pages) {
  return PagesImpl(exec, shape, kind, format, src, num_pages, shape.block_tokens, true, src_type,
                   pages);
}

absl::Status DequantizePage(const Exec& exec, const PageShape& shape, KvKind kind,
                            PageFormat format, const void* page, int num_tokens, float* dst) {
  return PagesImpl(exec, shape, kind, format, page, 1, num_tokens, false, SourceType::kF32, dst);
}

absl::Status DequantizePages(const Exec& exec, const PageShape& shape, KvKind kind,
                             PageFormat format, const void* pages, int num_pages, float* dst) {
  return PagesImpl(exec, shape, kind, format, pages, num_pages, shape.block_tokens, false,
                   SourceType::kF32, dst);
}

absl::Status PagedDecodeAttention(const Exec& exec, const PagedKvView& kv,
                                  const AttentionParams& params, const float* q, float* out,
                                  float* lse, float* slot_mass) {
  return AttentionImpl(exec, kv, params, 1, q, out, lse, slot_mass);
}

absl::Status PagedPrefillAttention(const Exec& exec, const PagedKvView& kv,
                                   const AttentionParams& params, int num_new, const float* q,
                                   float* out, float* lse, float* slot_mass) {
  return AttentionImpl(exec, kv, params, num_new, q, out, lse, slot_mass);
}

absl::Status CompactSlots(const Exec& exec, const PagedKvView& src, const CompactPlan& plan,
                          const PagedKvMut& dst) {
  if (absl::Status st = CheckBackend(exec); !st.ok()) return st;
  if (absl::Status st = CheckView(exec, src, "src"); !st.ok()) return st;
  if (absl::Status st = CheckView(exec, dst, "dst"); !st.ok()) return st;
  if (src.shape.block_tokens != dst.shape.block_tokens ||
      src.shape.num_kv_heads != dst.shape.num_kv_heads ||
      src.shape.head_dim != dst.shape.head_dim) {
    return absl::InvalidArgumentError("src and dst page shapes differ");
  }
  if (plan.num_out != dst.num_tokens || plan.members == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("plan.num_out=", plan.num_out,
                                                   " != dst.num_tokens=", dst.num_tokens,
                                                   " or null members"));
  }
  if (exec.backend != Backend::kCuda) {
    // Host-readable plan: reject out-of-range slots and bad weights up front.
    if (absl::Status st = CompactMetadata(plan, src.num_tokens, nullptr, nullptr, nullptr, nullptr);
        !st.ok()) {
      return st;
    }
  }
  switch (exec.backend) {
    case Backend::kReference:
      ref::Compact(src, plan, dst);
      return absl::OkStatus();
    case Backend::kCpu:
      cpu::Compact(exec.num_threads, src, plan, dst);
      return absl::OkStatus();
    case Backend::kCuda:
      POLYKV_CUDA_CALL("compact", cuda::Compact(exec.cuda_stream, src, plan, dst));
    default:
      return absl::InvalidArgumentError("unknown backend");
  }
}

absl::Status CompactMetadata(const CompactPlan& plan, int num_src, const int32_t* src_positions,
                             const int32_t* src_counts, int32_t* dst_positions,
                             int32_t* dst_counts) {
  if (plan.num_out < 0 || plan.members == nullptr) {
    return absl::InvalidArgumentError("bad plan: negative num_out or null members");
  }
  for (int j = 0; j < plan.num_out; ++j) {
    const int begin = plan.group_offsets ? plan.group_offsets[j] : j;
    const int end = plan.group_offsets ? plan.group_offsets[j + 1] : j + 1;
    if (end <= begin) {
      return absl::InvalidArgumentError(absl::StrCat("plan group ", j, " is empty"));
    }
    double wsum = 0;
    int32_t pos = INT32_MIN;
    int64_t count = 0;
    for (int m = begin; m < end; ++m) {
      const int s = plan.members[m];
      if (s < 0 || s >= num_src) {
        return absl::InvalidArgumentError(
            absl::StrCat("plan group ", j, " names slot ", s, " outside 0..", num_src - 1));
      }
      const float w = plan.weights ? plan.weights[m] : 1.0f;
      if (!(w >= 0.0f) || std::isinf(w)) {
        return absl::InvalidArgumentError(absl::StrCat("plan group ", j, " has weight ", w));
      }
      wsum += w;
      if (src_positions && src_positions[s] > pos) pos = src_positions[s];
      count += src_counts ? src_counts[s] : 1;
    }
    if (!(wsum > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("plan group ", j, " has zero total weight"));
    }
    if (dst_positions && src_positions) dst_positions[j] = pos;
    if (dst_counts) dst_counts[j] = int32_t(count);
  }
  return absl::OkStatus();
}

absl::Status KeyNorms(const Exec& exec, const PagedKvView& kv, float* norms) {
  if (absl::Status st = CheckBackend(exec); !st.ok()) return st;
  if (absl::Status st = CheckView(exec, kv, "kv"); !st.ok()) return st;
  if (norms == nullptr) return absl::InvalidArgumentError("null norms");
  switch (exec.backend) {
    case Backend::kReference:
      ref::KeyNorms(kv, norms);
      return absl::OkStatus();
    case Backend::kCpu:
      cpu::KeyNorms(exec.num_threads, kv, norms);
      return absl::OkStatus();
    case Backend::kCuda:
      POLYKV_CUDA_CALL("key norms", cuda::KeyNorms(exec.cuda_stream, kv, norms));
    default:
      return absl::InvalidArgumentError("unknown backend");
  }
}

absl::Status QkScores(const Exec& exec, const PagedKvView& kv, const float* queries,
                      int num_queries, float scale, float* scores) {
  if (absl::Status st = CheckBackend(exec); !st.ok()) return st;
  if (absl::Status st = CheckView(exec, kv, "kv"); !st.ok()) return st;
  if (queries == nullptr || scores == nullptr || num_queries < 0) {
    return absl::InvalidArgumentError("null queries/scores or negative num_queries");
  }
  switch (exec.backend) {
    case Backend::kReference:
      ref::QkScores(kv, queries, num_queries, scale, scores);
      return absl::OkStatus();
    case Backend::kCpu:
      cpu::QkScores(exec.num_threads, kv, queries, num_queries, scale, scores);
      return absl::OkStatus();
    case Backend::kCuda:
      POLYKV_CUDA_CALL("qk scores", cuda::QkScores(exec.cuda_stream, kv, queries, num_queries,
                                                   scale, scores));
    default:
      return absl::InvalidArgumentError("unknown backend");
  }
}

// ---- device helpers ----

bool CudaBuilt() { return POLYKV_KERNELS_WITH_CUDA != 0; }

#if POLYKV_KERNELS_WITH_CUDA
int CudaDeviceCount() {
  int n = 0;
  return cuda::DeviceCount(&n) == 0 ? n : 0;
}
absl::StatusOr<void*> DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  if (absl::Status st = FromCuda(cuda::Malloc(&p, bytes), "cudaMalloc"); !st.ok()) return st;
  return p;
}
absl::Status DeviceFree(void* p) { return FromCuda(cuda::Free(p), "cudaFree"); }
absl::Status CopyToDevice(void* dst, const void* src, size_t n) {
  return FromCuda(cuda::Memcpy(dst, src, n, 1), "cudaMemcpy H2D");
}
absl::Status CopyToHost(void* dst, const void* src, size_t n) {
  return FromCuda(cuda::Memcpy(dst, src, n, 2), "cudaMemcpy D2H");
}
absl::Status CopyOnDevice(void* dst, const void* src, size_t n) {
  return FromCuda(cuda::Memcpy(dst, src, n, 3), "cudaMemcpy D2D");
}
absl::Status DeviceSynchronize() { return FromCuda(cuda::Synchronize(), "cudaDeviceSynchronize"); }
absl::Status SetDevice(int device) { return FromCuda(cuda::SetDevice(device), "cudaSetDevice"); }
#else
int CudaDeviceCount() { return 0; }
absl::StatusOr<void*> DeviceAlloc(size_t) {
  return absl::FailedPreconditionError("polykv_kernels built without CUDA");
}
absl::Status DeviceFree(void*) {
  return absl::FailedPreconditionError("polykv_kernels built without CUDA");
}
absl::Status CopyToDevice(void*, const void*, size_t) {
  return absl::FailedPreconditionError("polykv_kernels built without CUDA");
}
absl::Status CopyToHost(void*, const void*, size_t) {
  return absl::FailedPreconditionError("polykv_kernels built without CUDA");
}
absl::Status CopyOnDevice(void*, const void*, size_t) {
  return absl::FailedPreconditionError("polykv_kernels built without CUDA");
}
absl::Status DeviceSynchronize() {
  return absl::FailedPreconditionError("polykv_kernels built without CUDA");
}
absl::Status SetDevice(int) {
  return absl::FailedPreconditionError("polykv_kernels built without CUDA");
}
#endif

}  // namespace polykv::kernels
