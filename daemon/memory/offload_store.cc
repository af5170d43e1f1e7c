#include "daemon/memory/offload_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/memory/crc32c.h"

namespace polykv::daemon {
namespace {

constexpr char kMagic[8] = {'P', 'K', 'V', 'O', 'F', 'F', '0', '1'};
constexpr const char* kPrefix = "polykv-offload-";

// A disk entry's first bytes. header_crc covers everything before it.
struct FileHeader {
  char magic[8];
  uint32_t instance;
  uint32_t pages;
  uint64_t key;
  uint64_t bytes;
  uint32_t data_crc;
  uint32_t header_crc;
};
static_assert(sizeof(FileHeader) == 40);

uint32_t HeaderCrc(const FileHeader& h) {
  return Crc32c({reinterpret_cast<const std::byte*>(&h), offsetof(FileHeader, header_crc)});
}

std::string ErrnoText(int e) { return std::strerror(e); }

// An fd closed on every path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// iovecs over spans, at most IOV_MAX per call: the whole list, written or
// read in order, retrying short transfers. errno on failure, 0 on success,
// -1 for a file that ended early.
template <typename Span, typename Op>
int TransferAll(int fd, off_t offset, std::span<const Span> spans, Op op) {
  size_t i = 0, done_in_first = 0;
  while (i < spans.size()) {
    std::vector<iovec> iov;
    for (size_t j = i; j < spans.size() && iov.size() < 512; ++j) {
      const size_t skip = j == i ? done_in_first : 0;
      iov.push_back({const_cast<std::byte*>(spans[j].data()) + skip, spans[j].size() - skip});
    }
    const ssize_t n = op(fd, iov.data(), static_cast<int>(iov.size()), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return -1;
    offset += n;
    size_t left = static_cast<size_t>(n);
    while (left > 0 && i < spans.size()) {
      const size_t rest = spans[i].size() - done_in_first;
      if (left < rest) {
        done_in_first += left;
        left = 0;
      } else {
        left -= rest;
        ++i;
        done_in_first = 0;
      }
    }
    while (i < spans.size() && spans[i].size() == 0) ++i;
  }
  return 0;
}

}  // namespace

const char* OffloadTierName(OffloadTier tier) {
  return tier == OffloadTier::kHost ? "host" : "disk";
}

absl::StatusOr<std::unique_ptr<OffloadStore>> OffloadStore::Create(
    const OffloadOptions& options) {
  if (options.host_bytes == 0 && options.disk_dir.empty()) {
    return absl::InvalidArgumentError("offload: neither a host tier nor a disk tier is set");
  }
  if (!options.disk_dir.empty()) {
    if (options.disk_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("offload: the disk tier (", options.disk_dir, ") has no capacity"));
    }
    std::error_code ec;
    std::filesystem::create_directories(options.disk_dir, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("offload: cannot make ", options.disk_dir, ": ", ec.message()));
    }
    ::chmod(options.disk_dir.c_str(), 0700);
    // Sessions end with the daemon, so every entry of an earlier run is
    // stale: removed, never served.
    for (const auto& file : std::filesystem::directory_iterator(options.disk_dir, ec)) {
      if (file.path().filename().string().starts_with(kPrefix)) {
        std::filesystem::remove(file.path(), ec);
      }
    }
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("offload: cannot clear ", options.disk_dir, ": ", ec.message()));
    }
  }
  return std::unique_ptr<OffloadStore>(new OffloadStore(options));
}

OffloadStore::OffloadStore(const OffloadOptions& options) : options_(options) {
  absl::MutexLock lock(&mu_);
  stats_.host_capacity = options.host_bytes;
  stats_.disk_capacity = options.disk_dir.empty() ? 0 : options.disk_bytes;
}

OffloadStore::~OffloadStore() {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, e] : entries_) {
    if (e.tier == OffloadTier::kDisk) ::unlink(PathOf(key).c_str());
  }
}

std::string OffloadStore::PathOf(uint64_t key) const {
  return absl::StrFormat("%s/%s%08x-%016x.kv", options_.disk_dir, kPrefix, options_.instance, key);
}

uint64_t OffloadStore::FileBytes(uint64_t bytes) { return sizeof(FileHeader) + bytes; }

absl::Status OffloadStore::Put(uint64_t key, std::span<const std::span<const std::byte>> pages) {
  uint64_t bytes = 0;
  uint32_t crc = 0;
  for (const auto& p : pages) {
    bytes += p.size();
    crc = Crc32c(p, crc);
  }
  absl::MutexLock io(&io_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (entries_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat("offload: entry ", key, " exists"));
    }
  }
  if (bytes <= options_.host_bytes) {
    auto fits = [&] {
      absl::MutexLock lock(&mu_);
      return stats_.host_bytes + bytes <= options_.host_bytes;
    };
    while (!fits() && SpillOldest()) {
    }
    if (fits()) {
      Entry e;
      e.bytes = bytes;
      e.pages = static_cast<uint32_t>(pages.size());
      e.crc = crc;
      e.data.resize(bytes);
      size_t at = 0;
      for (const auto& p : pages) {
        std::memcpy(e.data.data() + at, p.data(), p.size());
        at += p.size();
      }
      absl::MutexLock lock(&mu_);
      host_order_.push_back(key);
      e.lru = std::prev(host_order_.end());
      stats_.host_bytes += bytes;
      ++stats_.host_entries;
      entries_.emplace(key, std::move(e));
      return absl::OkStatus();
    }
  }
  const absl::Status written = WriteFile(key, pages, crc);
  absl::MutexLock lock(&mu_);
  if (!written.ok()) {
    if (absl::IsResourceExhausted(written)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "offload: no room for ", bytes, " bytes: host tier ", stats_.host_bytes, " of ",
          options_.host_bytes, " bytes used, disk tier: ", written.message()));
    }
    return written;
  }
  Entry e;
  e.tier = OffloadTier::kDisk;
  e.bytes = bytes;
  e.pages = static_cast<uint32_t>(pages.size());
  e.crc = crc;
  ++stats_.disk_entries;
  entries_.emplace(key, std::move(e));
  return absl::OkStatus();
}

absl::Status OffloadStore::WriteFile(uint64_t key,
                                     std::span<const std::span<const std::byte>> pages,
                                     uint32_t crc) {
  uint64_t bytes = 0;
  for (const auto& p : pages) bytes += p.size();
  if (options_.disk_dir.empty()) return absl::ResourceExhaustedError("none configured");
  {
    absl::MutexLock lock(&mu_);
    if (stats_.disk_bytes + FileBytes(bytes) > options_.disk_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(stats_.disk_bytes, " of ",
                                                       options_.disk_bytes, " bytes used"));
    }
    stats_.disk_bytes += FileBytes(bytes);  // taken before the write, given back on failure
  }
  auto fail = [&](absl::Status st) {
    absl::MutexLock lock(&mu_);
    stats_.disk_bytes -= FileBytes(bytes);
    ++stats_.disk_errors;
    return st;
  };
  const std::string path = PathOf(key);
  Fd f{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
  if (f.fd < 0) {
    return fail(absl::UnavailableError(absl::StrCat("offload: cannot create ", path, ": ",
                                                    ErrnoText(errno))));
  }
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.instance = options_.instance;
  h.pages = static_cast<uint32_t>(pages.size());
  h.key = key;
  h.bytes = bytes;
  h.data_crc = crc;
  h.header_crc = HeaderCrc(h);
  std::vector<std::span<const std::byte>> all;
  all.reserve(pages.size() + 1);
  all.emplace_back(reinterpret_cast<const std::byte*>(&h), sizeof(h));
  all.insert(all.end(), pages.begin(), pages.end());
  const int err = TransferAll<std::span<const std::byte>>(
      f.fd, 0, all, [](int fd, const iovec* iov, int n, off_t off) {
        return ::pwritev(fd, iov, n, off);
      });
  if (err != 0) {
    ::unlink(path.c_str());
    if (err == ENOSPC || err == EDQUOT) {
      return fail(absl::ResourceExhaustedError(absl::StrCat("the disk is full (", path, ")")));
    }
    return fail(absl::UnavailableError(absl::StrCat(
        "offload: cannot write ", path, ": ", err < 0 ? "short write" : ErrnoText(err))));
  }
  return absl::OkStatus();
}

bool OffloadStore::SpillOldest() {
  uint64_t key = 0;
  uint32_t crc = 0;
  std::span<const std::byte> data;
  {
    absl::MutexLock lock(&mu_);
    if (host_order_.empty()) return false;
    key = host_order_.front();
    Entry& e = entries_.at(key);
    e.io = true;
    crc = e.crc;
    data = e.data;  // stays: only a transfer (this one) moves or frees it
  }
  const bool written = WriteFile(key, std::span(&data, 1), crc).ok();
  absl::MutexLock lock(&mu_);
  Entry& e = entries_.at(key);
  if (written) {
    host_order_.erase(e.lru);
    stats_.host_bytes -= e.bytes;
    --stats_.host_entries;
    ++stats_.disk_entries;
    ++stats_.spilled;
    e.tier = OffloadTier::kDisk;
    std::vector<std::byte>().swap(e.data);
  }
  EndIo(key);
  return written;
}

absl::Status OffloadStore::Get(uint64_t key, std::span<const std::span<std::byte>> pages) {
  absl::MutexLock io(&io_mu_);
  OffloadTier tier;
  uint64_t bytes;
  uint32_t count, crc;
  const std::byte* data;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.dropped) {
      return absl::NotFoundError(absl::StrCat("offload: no entry ", key));
    }
    Entry& e = it->second;
    uint64_t want = 0;
    for (const auto& p : pages) want += p.size();
    if (want != e.bytes || pages.size() != e.pages) {
      return absl::InvalidArgumentError(absl::StrCat("offload: entry ", key, " holds ", e.pages,
                                                     " pages of ", e.bytes, " bytes, not ",
                                                     pages.size(), " of ", want));
    }
    e.io = true;
    tier = e.tier;
    bytes = e.bytes;
    count = e.pages;
    crc = e.crc;
    data = e.data.data();
  }
  absl::Status read = absl::OkStatus();
  if (tier == OffloadTier::kHost) {
    size_t at = 0;
    for (const auto& p : pages) {
      std::memcpy(p.data(), data + at, p.size());
      at += p.size();
    }
  } else {
    read = ReadFile(key, bytes, count, crc, pages);
  }
  if (read.ok()) {
    uint32_t got = 0;
    for (const auto& p : pages) got = Crc32c(p, got);
    if (got != crc) {
      read = absl::DataLossError(absl::StrCat("offload: entry ", key, " in ",
                                              OffloadTierName(tier), " fails its checksum"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (absl::IsDataLoss(read)) {
    ++stats_.corrupt;
    entries_.at(key).dropped = true;
  }
  EndIo(key);
  return read;
}

absl::Status OffloadStore::ReadFile(uint64_t key, uint64_t bytes, uint32_t pages, uint32_t crc,
                                    std::span<const std::span<std::byte>> out) const {
  const std::string path = PathOf(key);
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    return absl::DataLossError(absl::StrCat("offload: cannot open ", path, ": ",
                                            ErrnoText(errno)));
  }
  FileHeader h{};
  const std::span<std::byte> head(reinterpret_cast<std::byte*>(&h), sizeof(h));
  int err = TransferAll<std::span<std::byte>>(
      f.fd, 0, std::span(&head, 1),
      [](int fd, const iovec* iov, int n, off_t off) { return ::preadv(fd, iov, n, off); });
  if (err == 0 && (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 ||
                   h.header_crc != HeaderCrc(h) || h.instance != options_.instance ||
                   h.key != key || h.bytes != bytes || h.pages != pages || h.data_crc != crc)) {
    return absl::DataLossError(
        absl::StrCat("offload: ", path, " is not this entry (header does not match)"));
  }
  if (err == 0) {
    err = TransferAll<std::span<std::byte>>(
        f.fd, sizeof(FileHeader), out,
        [](int fd, const iovec* iov, int n, off_t off) { return ::preadv(fd, iov, n, off); });
  }
  if (err != 0) {
    return absl::DataLossError(absl::StrCat("offload: cannot read ", path, ": ",
                                            err < 0 ? "file too short" : ErrnoText(err)));
  }
  return absl::OkStatus();
}

void OffloadStore::EndIo(uint64_t key) {
  Entry& e = entries_.at(key);
  e.io = false;
  if (e.dropped) Forget(key);
}

void OffloadStore::Drop(uint64_t key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.io) {
    it->second.dropped = true;  // its transfer forgets it
  } else {
    Forget(key);
  }
}

void OffloadStore::Forget(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (e.tier == OffloadTier::kHost) {
    host_order_.erase(e.lru);
    stats_.host_bytes -= e.bytes;
    --stats_.host_entries;
  } else {
    ::unlink(PathOf(key).c_str());
    stats_.disk_bytes -= FileBytes(e.bytes);
    --stats_.disk_entries;
  }
  entries_.erase(it);
}

std::optional<OffloadTier> OffloadStore::Where(uint64_t key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.dropped) return std::nullopt;
  return it->second.tier;
}

OffloadStore::Stats OffloadStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace polykv::daemon
