// Dispatch for the vector dequantization kernels (dequant.h).
#include "client/worker/weights/dequant.h"

#include "client/worker/weights/ggml_types.h"

namespace polykv::worker {

DequantFn DequantKernel(uint32_t type, Isa isa) {
  DequantFn f = nullptr;
  if (isa >= Isa::kAvx512) f = dequant_internal::Avx512Kernel(type);
  if (f == nullptr && isa >= Isa::kAvx2) f = dequant_internal::Avx2Kernel(type);
  return f;
}

absl::Status DequantizeWith(Isa isa, uint32_t type, const void* src, int64_t n, float* dst) {
  const DequantFn f = DequantKernel(type, isa);
  int be = 0, bb = 0;
  if (f == nullptr || !GgmlBlockInfo(type, &be, &bb) || n % be != 0) {
    return Dequantize(type, src, n, dst);  // Also the errors' wording.
  }
  f(static_cast<const uint8_t*>(src), n / be, dst);
  return absl::OkStatus();
}

absl::Status DequantizeFast(uint32_t type, const void* src, int64_t n, float* dst) {
  return DequantizeWith(BestIsa(), type, src, n, dst);
}

}  // namespace polykv::worker
