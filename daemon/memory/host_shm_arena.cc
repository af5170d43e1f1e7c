#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/memory/arena.h"

namespace polykv::daemon {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A memfd has no path a peer could guess or list: workers get the descriptor
// only through the token-checked fd socket (rpc/fd_broker.h).
class HostShmArena final : public Arena {
 public:
  HostShmArena(uint32_t id, uint64_t size, int fd, void* base)
      : id_(id), size_(size), fd_(fd), base_(base) {}
  ~HostShmArena() override {
    munmap(base_, size_);
    close(fd_);
  }
  HostShmArena(const HostShmArena&) = delete;
  HostShmArena& operator=(const HostShmArena&) = delete;

  uint32_t id() const override { return id_; }
  ArenaKind kind() const override { return ArenaKind::kHostShm; }
  uint64_t size_bytes() const override { return size_; }
  void* host_base() const override { return base_; }
  int fd() const override { return fd_; }
  ArenaExport Export() const override {
    ArenaExport e;
    e.arena_id = id_;
    e.kind = ArenaKind::kHostShm;
    e.size_bytes = size_;
    return e;
  }
  absl::Status Zero(uint64_t offset, uint64_t len) override {
    if (offset > size_ || len > size_ - offset) {
      return absl::InvalidArgumentError(absl::StrCat("range ", offset, "+", len,
                                                     " outside arena ", id_));
    }
    std::memset(static_cast<char*>(base_) + offset, 0, len);
    return absl::OkStatus();
  }
  absl::Status Discard() override {
    // A hole in a memfd frees its pages for every mapper at once (their
    // mappings stay valid and read zeros); the seals allow it, they only fix
    // the size.
    if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                  static_cast<off_t>(size_)) != 0) {
      return Errno("punching arena memfd");
    }
    return absl::OkStatus();
  }
  uint64_t ResidentBytes() const override {
    struct stat st;
    if (fstat(fd_, &st) != 0) return size_;  // unknown: count it all
    return std::min<uint64_t>(size_, uint64_t(st.st_blocks) * 512);
  }

 private:
  const uint32_t id_;
  const uint64_t size_;
  const int fd_;
  void* const base_;
};

}  // namespace

absl::string_view ArenaKindName(ArenaKind kind) {
  switch (kind) {
    case ArenaKind::kHostShm: return "host memory (memfd)";
    case ArenaKind::kCudaVmm: return "CUDA device memory (VMM fd)";
    case ArenaKind::kCudaIpc: return "CUDA device memory (legacy IPC handle)";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Arena>> CreateHostShmArena(const ArenaOptions& options) {
  if (options.size_bytes == 0) return absl::InvalidArgumentError("arena size must be > 0");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t size = (options.size_bytes + page - 1) / page * page;
  int fd = memfd_create(absl::StrCat("polykv-arena-", options.id).c_str(),
                        MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    absl::Status s = Errno("sizing arena memfd");
    close(fd);
    return s;
  }
  // The size is final: sealing stops anyone holding the fd from shrinking it
  // under the daemon (which would turn page accesses into SIGBUS).
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    absl::Status s = Errno("mmap arena");
    close(fd);
    return s;
  }
  return std::unique_ptr<Arena>(new HostShmArena(options.id, size, fd, base));
}

}  // namespace polykv::daemon
