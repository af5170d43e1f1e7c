// DeviceKernels: the paged KV store's kernel calls when its pages are in GPU
// memory (a polykvd with --tier cuda) while the worker's tensors stay in
// host memory, as in this reference worker: page encodes and decodes and
// attention run as the CUDA kernels over the pages where they are, their
// host arguments staged into reusable device buffers and their results
// copied back. The CPU path (PagedKvStore with host pages) never uses it.
//
// Not on the device: the prefill attention mass (the CUDA kernel has none
// yet; UNIMPLEMENTED, so a session whose policy wants it fails loudly),
// and the store's recent f16 window (its copies are host memory).
//
// Thread-safety: not thread-safe; one per store.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/ops.h"

namespace polykv::worker {

class DeviceKernels {
 public:
  // `rows` rows of f32 (host, [rows][heads][dim]) encoded into a device page.
  absl::Status QuantizePage(const kernels::PageShape& shape, kernels::KvKind kind,
                            kernels::PageFormat format, const float* rows, int num_rows,
                            void* page);
  // The first `num_rows` rows of a device page, decoded into host f32.
  absl::Status DequantizePage(const kernels::PageShape& shape, kernels::KvKind kind,
                              kernels::PageFormat format, const void* page, int num_rows,
                              float* rows);
  // Paged attention over device pages: kv.blocks and params.slot_bias are
  // host arrays, q/out/slot_mass host buffers (shapes as in kernels/ops.h);
  // num_new == 1 is decode, more a prefill chunk.
  absl::Status Attention(const kernels::PagedKvView& kv, const kernels::AttentionParams& params,
                         int num_new, const float* q, float* out, float* slot_mass);

 private:
  // `buffer` holding at least `bytes` (grown, never shrunk), then `host`'s
  // bytes copied in when given.
  absl::Status Stage(kernels::DeviceBuffer& buffer, size_t bytes, const void* host = nullptr);

  kernels::DeviceBuffer rows_, table_, bias_, q_, out_, mass_;
};

}  // namespace polykv::worker
