#include "client/worker/device_kernels.h"

#include "absl/strings/str_cat.h"

namespace polykv::worker {
namespace {

const kernels::Exec kCuda{kernels::Backend::kCuda};

size_t RowBytes(const kernels::PageShape& shape, int num_rows) {
  return size_t(num_rows) * shape.num_kv_heads * shape.head_dim * sizeof(float);
}

}  // namespace

absl::Status DeviceKernels::Stage(kernels::DeviceBuffer& buffer, size_t bytes, const void* host) {
  if (buffer.size() < bytes) {
    auto b = kernels::DeviceBuffer::Allocate(bytes);
    if (!b.ok()) return b.status();
    buffer = *std::move(b);
  }
  if (host != nullptr && bytes > 0) return kernels::CopyToDevice(buffer.get(), host, bytes);
  return absl::OkStatus();
}

absl::Status DeviceKernels::QuantizePage(const kernels::PageShape& shape, kernels::KvKind kind,
                                         kernels::PageFormat format, const float* rows,
                                         int num_rows, void* page) {
  if (auto st = Stage(rows_, RowBytes(shape, num_rows), rows); !st.ok()) return st;
  return kernels::QuantizePage(kCuda, shape, kind, format, rows_.get(), kernels::SourceType::kF32,
                               num_rows, page);
}

absl::Status DeviceKernels::DequantizePage(const kernels::PageShape& shape, kernels::KvKind kind,
                                           kernels::PageFormat format, const void* page,
                                           int num_rows, float* rows) {
  const size_t bytes = RowBytes(shape, num_rows);
  if (auto st = Stage(rows_, bytes); !st.ok()) return st;
  if (auto st = kernels::DequantizePage(kCuda, shape, kind, format, page, num_rows,
                                        rows_.as<float>());
      !st.ok()) {
    return st;
  }
  return kernels::CopyToHost(rows, rows_.get(), bytes);
}

absl::Status DeviceKernels::Attention(const kernels::PagedKvView& kv,
                                      const kernels::AttentionParams& params, int num_new,
                                      const float* q, float* out, float* slot_mass) {
  const size_t qo_bytes =
      size_t(num_new) * params.num_q_heads * kv.shape.head_dim * sizeof(float);
  const size_t mass_bytes = size_t(kv.shape.num_kv_heads) * kv.num_tokens * sizeof(float);
  kernels::PagedKvView on_device = kv;
  kernels::AttentionParams p = params;
  if (auto st = Stage(table_, size_t(kv.num_blocks) * sizeof(kernels::BlockEntry), kv.blocks);
      !st.ok()) {
    return st;
  }
  on_device.blocks = table_.as<const kernels::BlockEntry>();
  if (params.slot_bias != nullptr) {
    if (auto st = Stage(bias_, size_t(kv.num_tokens) * sizeof(float), params.slot_bias);
        !st.ok()) {
      return st;
    }
    p.slot_bias = bias_.as<const float>();
  }
  if (auto st = Stage(q_, qo_bytes, q); !st.ok()) return st;
  if (auto st = Stage(out_, qo_bytes); !st.ok()) return st;
  if (slot_mass != nullptr) {
    if (auto st = Stage(mass_, mass_bytes); !st.ok()) return st;
  }
  float* mass = slot_mass != nullptr ? mass_.as<float>() : nullptr;
  absl::Status st =
      num_new == 1
          ? kernels::PagedDecodeAttention(kCuda, on_device, p, q_.as<const float>(),
                                          out_.as<float>(), nullptr, mass)
          : kernels::PagedPrefillAttention(kCuda, on_device, p, num_new, q_.as<const float>(),
                                           out_.as<float>(), nullptr, mass);
  if (!st.ok()) return st;
  if (auto c = kernels::CopyToHost(out, out_.get(), qo_bytes); !c.ok()) return c;
  if (slot_mass != nullptr) return kernels::CopyToHost(slot_mass, mass_.get(), mass_bytes);
  return absl::OkStatus();
}

}  // namespace polykv::worker
