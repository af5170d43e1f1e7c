// PagedKvStore with its pages in GPU memory (the CUDA backend, DeviceKernels)
// against the same store over host pages (CTest label gpu; skips without a
// CUDA build or device): prefill chunks and decode steps of random K/V and
// queries, every layer's attention output within the kernels' tolerance of
// the CPU path's, in f32 pages and in quantized ones; and a table adopted
// mid-block, whose rows the store decodes back from the device pages.
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "client/worker/paged_kv_store.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/unit/worker/random_steps.h"

namespace polykv::worker {
namespace {

using kernels::PageFormat;
using testing::kBlock;
using testing::RandomQ;
using testing::RandomRows;
using testing::RelL2;
using testing::Shape;
using testing::Step;

// Pages in device memory, one buffer each.
class DevicePages : public PageSource {
 public:
  explicit DevicePages(PageFormat format) : format_(format) {}
  int block_tokens() const override { return kBlock; }
  absl::StatusOr<std::vector<PagedBlock>> Reserve(int64_t total) override {
    std::vector<PagedBlock> added;
    const kernels::PageShape shape{kBlock, Shape().num_kv_heads, Shape().head_dim};
    while (reserved_ < total) {
      PagedBlock b;
      b.k_format = b.v_format = format_;
      for (int l = 0; l < Shape().num_layers; ++l) {
        for (auto [kind, pages] : {std::pair{kernels::KvKind::kKey, &b.k_pages},
                                   std::pair{kernels::KvKind::kValue, &b.v_pages}}) {
          auto buffer = kernels::DeviceBuffer::Allocate(kernels::PageBytes(format_, kind, shape));
          if (!buffer.ok()) return buffer.status();
          pages->push_back(buffer->get());
          buffers_.push_back(*std::move(buffer));
        }
      }
      added.push_back(b);
      reserved_ += kBlock;
    }
    return added;
  }
  absl::Status Commit(int64_t, std::span<const StepToken>) override { return absl::OkStatus(); }
  absl::StatusOr<std::optional<PagedTable>> Sync() override { return std::nullopt; }
  int64_t bytes() const override { return 0; }
  std::string name() const override { return "device"; }

 private:
  const PageFormat format_;
  std::vector<kernels::DeviceBuffer> buffers_;
  int64_t reserved_ = 0;
};

class PagedStoreDeviceTest : public ::testing::TestWithParam<PageFormat> {
 protected:
  void SetUp() override {
    if (!kernels::CudaBuilt()) GTEST_SKIP() << "built without CUDA";
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(PagedStoreDeviceTest, AttentionMatchesTheHostPagesStore) {
  const PageFormat format = GetParam();
  PagedKvStoreOptions o;
  o.shape = Shape();
  o.sync_every_steps = 1;
  auto host = PagedKvStore::Create(o, testing::HeapSource(format));
  ASSERT_TRUE(host.ok()) << host.status();
  // No streams wanted: the device has no prefill attention mass yet.
  auto source = std::make_unique<testing::RepublishingSource>(
      std::make_unique<DevicePages>(format), WantedStreams{});
  testing::RepublishingSource* device_source = source.get();
  o.exec.backend = kernels::Backend::kCuda;
  auto device = PagedKvStore::Create(o, std::move(source));
  ASSERT_TRUE(device.ok()) << device.status();

  // f32 pages: the same arithmetic up to summation order; quantized ones:
  // the device's codes may round a value the other way.
  const double tolerance = format == PageFormat::kF32 ? 1e-5 : 2e-2;
  std::mt19937 rng(kernels::testing::TestSeed(45));
  int position = 0;
  for (int step = 0; step < 24; ++step) {
    const int n = step == 0 ? 35 : step == 12 ? 9 : 1;  // prefill, decode, a chunk, decode
    // 46 slots by then: the table is adopted with its last block 14 rows full.
    if (step == 12) device_source->Publish();
    const auto rows = RandomRows(n, rng);
    const auto q = RandomQ(n, rng);
    const auto want = Step(host->get(), rows, q, position);
    const auto got = Step(device->get(), rows, q, position);
    EXPECT_LT(RelL2(got, want), tolerance) << "step " << step << " (" << n << " tokens)";
    position += n;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedStoreDeviceTest,
                         ::testing::Values(PageFormat::kF32, PageFormat::kF16, PageFormat::kInt8,
                                           PageFormat::kInt4));

}  // namespace
}  // namespace polykv::worker
