// Quantize / dequantize kernels. One thread per quantization unit
// (page_codec.h), so codes and params are bit-identical to the CPU paths.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/quantize.cuh"
#include "kernels/page_codec.h"

namespace polykv::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void QuantizePagesKernel(const void* src, SourceType src_type, PageGeom g,
                                    PageFormat f, KvKind kind, int rows, uint8_t* pages,
                                    size_t page_bytes, size_t units, int num_pages) {
  const size_t total = units * size_t(num_pages);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t p = i / units, u = i % units;
    uint8_t* page = pages + p * page_bytes;
    if (src_type == SourceType::kF32) {
      const F32Rows r{static_cast<const float*>(src) + p * g.Elems(), g.num_kv_heads, g.head_dim};
      QuantizeUnit(r, rows, g, f, kind, page, u);
    } else {
      const F16Rows r{static_cast<const uint16_t*>(src) + p * g.Elems(), g.num_kv_heads,
                      g.head_dim};
      QuantizeUnit(r, rows, g, f, kind, page, u);
    }
  }
}

__global__ void DequantizePagesKernel(const uint8_t* pages, PageGeom g, PageFormat f, KvKind kind,
                                      int rows, size_t page_bytes, int num_pages, float* dst) {
  const size_t per_page = size_t(rows) * g.num_kv_heads * g.head_dim;
  const size_t total = per_page * num_pages;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t p = i / per_page, e = i % per_page;
    const int d = int(e % g.head_dim);
    const int h = int(e / g.head_dim % g.num_kv_heads);
    const int t = int(e / (size_t(g.head_dim) * g.num_kv_heads));
    dst[p * g.Elems() + e] = DecodeElem(pages + p * page_bytes, g, f, kind, t, h, d);
  }
}

// blockIdx.y (strided by gridDim.y) = destination block; threads cover that
// page's units.
__global__ void QuantizeTableKernel(const float* rows, int num_rows, PageGeom g, KvKind kind,
                                    uint8_t* base, const BlockEntry* blocks, int num_blocks) {
  for (int b = blockIdx.y; b < num_blocks; b += gridDim.y) {
  const BlockEntry e = blocks[b];
  const PageFormat f = kind == KvKind::kKey ? e.k_format : e.v_format;
  uint8_t* page = PagePtr(base, kind == KvKind::kKey ? e.k_offset : e.v_offset);
  const int n = min(g.block_tokens, num_rows - b * g.block_tokens);
  const F32Rows src{rows + size_t(b) * g.Elems(), g.num_kv_heads, g.head_dim};
  const size_t units = NumQuantUnits(g, f, kind);
  for (size_t u = blockIdx.x * size_t(blockDim.x) + threadIdx.x; u < units;
       u += size_t(gridDim.x) * blockDim.x) {
    QuantizeUnit(src, n, g, f, kind, page, u);
  }
  }
}

}  // namespace

int LaunchQuantizeTable(cudaStream_t stream, const float* rows, int num_rows, const PageGeom& g,
                        KvKind kind, uint8_t* base, const BlockEntry* blocks, int num_blocks) {
  if (num_blocks == 0) return 0;
  // Enough x-blocks for the largest unit count (float formats: T*H rows).
  const size_t max_units = size_t(g.block_tokens) * g.num_kv_heads *
                           (g.head_dim / kValueGroup > 0 ? g.head_dim / kValueGroup : 1);
  const dim3 grid(unsigned((max_units + kThreads - 1) / kThreads),
                  unsigned(num_blocks < 65535 ? num_blocks : 65535));
  QuantizeTableKernel<<<grid, kThreads, 0, stream>>>(rows, num_rows, g, kind, base, blocks,
                                                     num_blocks);
  return int(cudaGetLastError());
}

int QuantizePages(void* stream, const PageShape& shape, KvKind kind, PageFormat format,
                  const void* src, SourceType src_type, int num_pages, int rows_per_page,
                  void* pages) {
  const PageGeom g = GeomOf(shape);
  const size_t units = NumQuantUnits(g, format, kind);
  QuantizePagesKernel<<<GridFor(units * num_pages, kThreads), kThreads, 0, AsStream(stream)>>>(
      src, src_type, g, format, kind, rows_per_page, static_cast<uint8_t*>(pages),
      g.PageBytes(format, kind), units, num_pages);
  return int(cudaGetLastError());
}

int DequantizePages(void* stream, const PageShape& shape, KvKind kind, PageFormat format,
                    const void* pages, int num_pages, int rows_per_page, float* dst) {
  const PageGeom g = GeomOf(shape);
  const size_t work = size_t(rows_per_page) * g.num_kv_heads * g.head_dim * num_pages;
  DequantizePagesKernel<<<GridFor(work, kThreads), kThreads, 0, AsStream(stream)>>>(
      static_cast<const uint8_t*>(pages), g, format, kind, rows_per_page,
      g.PageBytes(format, kind), num_pages, dst);
  return int(cudaGetLastError());
}

}  // namespace polykv::kernels::cuda
