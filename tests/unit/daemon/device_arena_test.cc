// Device arenas from the host's side (issue 45, scope 6): what can be checked
// without a GPU. The cuda tier's errors with no device; the negotiation that
// refuses, at OpenSession and with nothing held, a worker that cannot map the
// pool's arenas; a VMM arena's descriptor handed out with exactly a memfd's
// checks (token, tenant); a client that cannot import it says so before it
// fetches. The GPU side is tests/integration/gpu_pool_test.cc.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "client/lib/arena_mapper.h"
#include "daemon/memory/arena.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/rpc/convert.h"
#include "daemon/rpc/fd_broker.h"
#include "kernels/device.h"
#include "polykv/client.h"
#include "tests/unit/daemon/in_process_daemon.h"

namespace polykv::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Host shared memory posing as a CUDA VMM arena: the pool and the fd socket
// treat it as device memory (no host base, kind kCudaVmm) while its
// descriptor is a real memfd the test can inspect.
class FakeVmmArena final : public Arena {
 public:
  explicit FakeVmmArena(std::unique_ptr<Arena> host) : host_(std::move(host)) {}
  uint32_t id() const override { return host_->id(); }
  ArenaKind kind() const override { return ArenaKind::kCudaVmm; }
  uint64_t size_bytes() const override { return host_->size_bytes(); }
  void* host_base() const override { return nullptr; }
  int fd() const override { return host_->fd(); }
  ArenaExport Export() const override {
    ArenaExport e = host_->Export();
    e.kind = ArenaKind::kCudaVmm;
    e.cuda_device = 0;
    return e;
  }
  absl::Status Zero(uint64_t offset, uint64_t len) override { return host_->Zero(offset, len); }
  absl::Status Discard() override { return host_->Discard(); }
  uint64_t ResidentBytes() const override { return host_->ResidentBytes(); }

 private:
  std::unique_ptr<Arena> host_;
};

std::unique_ptr<KvPool> MakePool(ArenaKind kind) {
  KvPoolOptions o;
  o.pool_bytes = 16 * kMiB;
  o.arena_bytes = 4 * kMiB;
  o.superblock_bytes = 256 * 1024;
  o.arena_kind = kind;
  if (kind == ArenaKind::kHostShm) {
    o.arena_factory = CreateHostShmArena;
  } else {
    o.cuda_device = 0;
    o.arena_factory = [](const ArenaOptions& a) -> absl::StatusOr<std::unique_ptr<Arena>> {
      auto host = CreateHostShmArena(a);
      if (!host.ok()) return host.status();
      return std::unique_ptr<Arena>(new FakeVmmArena(*std::move(host)));
    };
  }
  auto p = KvPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

OpenRequest Request(const std::string& tenant, std::vector<ArenaKind> can_map) {
  OpenRequest r;
  r.agent_id = "a";
  r.tenant = tenant;
  r.profile = {4, 2, 64, DType::kF32, "tiny"};
  r.peer = {getpid(), getuid(), getgid()};
  r.can_map = std::move(can_map);
  return r;
}

TEST(DeviceArenaTest, WithoutADeviceTheCudaTierSaysWhatToDo) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  for (ArenaKind kind : {ArenaKind::kCudaVmm, ArenaKind::kCudaIpc}) {
    auto a = CreateCudaArena(kind, ArenaOptions{1, 4 * kMiB, 0});
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), kernels::CudaBuilt() ? absl::StatusCode::kFailedPrecondition
                                                      : absl::StatusCode::kUnimplemented)
        << a.status();
    EXPECT_NE(a.status().message().find("--tier host"), std::string::npos) << a.status();
  }
  EXPECT_EQ(CreateCudaArena(ArenaKind::kHostShm, ArenaOptions{1, kMiB, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nor can anything be shared or imported: clear errors, no crash.
  for (auto status :
       {kernels::SharedDeviceMemory::Create(kernels::DeviceShare::kPosixFd, 0, kMiB).status(),
        kernels::SharedDeviceMemory::ImportFd(0, 0, kMiB).status(),
        kernels::SharedDeviceMemory::ImportIpc(0, std::string(64, 'x'), kMiB).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  }
}

TEST(DeviceArenaTest, AWorkerThatCannotMapThePoolsArenasIsRefusedBeforeItHoldsAnything) {
  auto device_pool = MakePool(ArenaKind::kCudaVmm);
  auto refused = device_pool->Open(Request("t", {ArenaKind::kHostShm}));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("CUDA device memory (VMM fd)"), std::string::npos)
      << refused.status();
  EXPECT_EQ(device_pool->Stats().num_sessions, 0u);
  EXPECT_EQ(device_pool->Stats().used_bytes, 0u);

  // Stated and matching, or not stated (an older client): opened, and told
  // where its pages are.
  for (auto can_map : {std::vector<ArenaKind>{ArenaKind::kCudaVmm, ArenaKind::kCudaIpc},
                       std::vector<ArenaKind>{}}) {
    auto s = device_pool->Open(Request("t", can_map));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->arena_kind, ArenaKind::kCudaVmm);
    EXPECT_EQ(s->cuda_device, 0);
  }

  auto host_pool = MakePool(ArenaKind::kHostShm);
  auto device_only = host_pool->Open(Request("t", {ArenaKind::kCudaVmm}));
  ASSERT_FALSE(device_only.ok());
  EXPECT_EQ(device_only.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(device_only.status().message().find("--tier cuda"), std::string::npos);
  EXPECT_EQ(host_pool->Stats().num_sessions, 0u);
  auto host = host_pool->Open(Request("t", {ArenaKind::kHostShm}));
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->arena_kind, ArenaKind::kHostShm);
  EXPECT_EQ(host->cuda_device, -1);
}

TEST(DeviceArenaTest, TheWireCarriesTheKindsBothWays) {
  v1::OpenSessionRequest req;
  req.add_can_map(v1::ArenaHandle::KIND_CUDA_VMM);
  req.add_can_map(v1::ArenaHandle::KIND_HOST_SHM);
  auto r = FromProto(req, PeerCreds{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->can_map, (std::vector{ArenaKind::kCudaVmm, ArenaKind::kHostShm}));
  req.add_can_map(static_cast<v1::ArenaHandle::Kind>(9));
  EXPECT_EQ(FromProto(req, PeerCreds{}).status().code(), absl::StatusCode::kInvalidArgument);

  ArenaExport e;
  e.kind = ArenaKind::kCudaVmm;
  e.cuda_device = 3;
  v1::ArenaHandle h;
  ToProto(e, &h);
  EXPECT_EQ(h.kind(), v1::ArenaHandle::KIND_CUDA_VMM);
  EXPECT_EQ(h.cuda_device(), 3);
}

// The fd socket hands out a VMM arena's descriptor after the same checks as
// a memfd's; a client without a device refuses to import it, and says why.
TEST(DeviceArenaTest, AVmmDescriptorTravelsOnlyToItsTenantsSessions) {
  auto pool = MakePool(ArenaKind::kCudaVmm);
  auto s = pool->Open(Request("owner", {ArenaKind::kCudaVmm}));
  ASSERT_TRUE(s.ok()) << s.status();
  const PeerCreds peer{getpid(), getuid(), getgid()};
  auto r = pool->Reserve(s->session_id, s->token, peer, 16);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->new_arenas.size(), 1u);
  const ArenaExport arena = r->new_arenas[0];
  EXPECT_EQ(arena.kind, ArenaKind::kCudaVmm);
  auto other = pool->Open(Request("other", {ArenaKind::kCudaVmm}));
  ASSERT_TRUE(other.ok()) << other.status();

  const TestFdBroker o = StartFdBroker(pool.get(), "device-fd", 0600, {getuid()});
  ASSERT_NE(o.broker, nullptr);

  uint64_t size = 0;
  auto fd = FetchArenaFd(o.path, SessionRef{s->session_id, s->token}, arena.arena_id, &size);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(size, arena.size_bytes) << "the reply's size is the arena's (a VMM fd has none)";
  struct stat st {};
  ASSERT_EQ(fstat(*fd, &st), 0);
  EXPECT_EQ(uint64_t(st.st_size), arena.size_bytes);
  close(*fd);

  std::string forged = s->token;
  forged[0] ^= 1;
  EXPECT_EQ(FetchArenaFd(o.path, SessionRef{s->session_id, forged}, arena.arena_id)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(FetchArenaFd(o.path, SessionRef{other->session_id, other->token}, arena.arena_id)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);

  if (kernels::CudaDeviceCount() == 0) {
    internal::ArenaMapper mapper(o.path, SessionRef{s->session_id, s->token});
    v1::ArenaHandle h;
    ToProto(arena, &h);
    const absl::Status mapped = mapper.Add(h);
    EXPECT_EQ(mapped.code(), absl::StatusCode::kFailedPrecondition) << mapped;
    EXPECT_NE(mapped.message().find(kernels::CudaBuilt() ? "no CUDA device" : "without CUDA"),
              std::string::npos)
        << mapped;
    EXPECT_FALSE(mapper.Address(arena.arena_id, 0, 1).ok());
  }
  o.broker->Stop();
}

// An arena handed out with another size than announced is not mapped.
TEST(DeviceArenaTest, AnArenaOfAnotherSizeThanAnnouncedIsNotMapped) {
  auto pool = MakePool(ArenaKind::kHostShm);
  auto s = pool->Open(Request("t", {ArenaKind::kHostShm}));
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = pool->Reserve(s->session_id, s->token, PeerCreds{getpid(), getuid(), getgid()}, 16);
  ASSERT_TRUE(r.ok()) << r.status();
  const TestFdBroker o = StartFdBroker(pool.get(), "size-fd", 0600, {getuid()});
  ASSERT_NE(o.broker, nullptr);
  internal::ArenaMapper mapper(o.path, SessionRef{s->session_id, s->token});
  v1::ArenaHandle h;
  ToProto(r->new_arenas[0], &h);
  h.set_size_bytes(h.size_bytes() * 2);
  const absl::Status st = mapper.Add(h);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_FALSE(mapper.Address(h.arena_id(), 0, 1).ok());
  h.set_size_bytes(r->new_arenas[0].size_bytes);
  EXPECT_TRUE(mapper.Add(h).ok());
  EXPECT_TRUE(mapper.Address(h.arena_id(), 0, 1).ok());
  o.broker->Stop();
}

// Over gRPC, against a host daemon: a client without a device cannot ask for
// device pages (refused before any call), a host-pages worker opens, and a
// worker stating only device kinds is refused by the daemon with nothing held.
TEST(DeviceArenaTest, TheNegotiationHoldsOverTheWire) {
  const DaemonConfig c = SmallDaemonConfig("device-arena");
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  auto client = Client::Connect(c.socket);
  ASSERT_TRUE(client.ok()) << client.status();
  SessionOptions o;
  o.agent_id = "a";
  o.profile = {4, 2, 64, DType::kF32, "tiny"};
  o.heartbeat = false;

  o.page_memory = PageMemory::kHost;
  auto host = (*client)->OpenSession(o);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_FALSE((*host)->info().pages_on_device);
  auto blocks = (*host)->Reserve(16);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_FALSE(blocks->front().pages.front().on_device);
  EXPECT_NE(blocks->front().pages.front().addr, nullptr);
  ASSERT_TRUE((*host)->Close().ok());

  o.page_memory = PageMemory::kEither;
  auto either = (*client)->OpenSession(o);
  ASSERT_TRUE(either.ok()) << either.status();
  ASSERT_TRUE((*either)->Close().ok());

  o.page_memory = PageMemory::kDevice;
  auto device = (*client)->OpenSession(o);
  if (kernels::CudaDeviceCount() == 0) {
    ASSERT_FALSE(device.ok());
    EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
    EXPECT_NE(device.status().message().find("device"), std::string::npos) << device.status();
  } else {
    ASSERT_FALSE(device.ok());
    EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
    EXPECT_NE(device.status().message().find("--tier cuda"), std::string::npos)
        << device.status();
  }
  EXPECT_EQ(d->pool()->Stats().num_sessions, 0u);
  d->Shutdown();
}

}  // namespace
}  // namespace polykv::daemon
