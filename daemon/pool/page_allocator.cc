#include "daemon/pool/page_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {
namespace {
constexpr uint32_t kMaxArenaId = (1u << 16) - 1;
constexpr uint64_t kMaxIndex = (1ull << 24) - 1;
}  // namespace

PageAllocator::PageAllocator(const PageAllocatorOptions& options)
    : superblock_bytes_(std::max<uint64_t>(
          kSizeClassAlignment,
          options.superblock_bytes / kSizeClassAlignment * kSizeClassAlignment)) {}

uint32_t PageAllocator::SizeClass(uint64_t page_bytes) {
  return static_cast<uint32_t>((page_bytes + kSizeClassAlignment - 1) / kSizeClassAlignment *
                               kSizeClassAlignment);
}

PageId PageAllocator::MakeId(SbRef r, uint32_t slot) {
  return (uint64_t(r.arena) << 48) | (uint64_t(r.index) << 24) | slot;
}

absl::Status PageAllocator::AddArena(uint32_t arena_id, uint64_t size_bytes) {
  if (arena_id == 0 || arena_id > kMaxArenaId) {
    return absl::InvalidArgumentError(absl::StrCat("arena id ", arena_id, " out of range"));
  }
  if (arenas_.contains(arena_id)) {
    return absl::AlreadyExistsError(absl::StrCat("arena ", arena_id, " already added"));
  }
  const uint64_t count = size_bytes / superblock_bytes_;
  if (count == 0 || count > kMaxIndex) {
    return absl::InvalidArgumentError(absl::StrCat("arena of ", size_bytes,
                                                   " bytes cannot hold superblocks of ",
                                                   superblock_bytes_, " bytes"));
  }
  ArenaState& a = arenas_[arena_id];
  a.size_bytes = size_bytes;
  a.superblocks.resize(count);
  for (uint64_t i = 0; i < count; ++i) a.superblocks[i].offset = i * superblock_bytes_;
  // Push in reverse so the lowest offsets are used first.
  for (uint64_t i = count; i-- > 0;) {
    free_superblocks_.push_back(SbRef{arena_id, static_cast<uint32_t>(i)});
  }
  arena_bytes_ += size_bytes;
  num_superblocks_ += count;
  return absl::OkStatus();
}

absl::Status PageAllocator::RemoveArena(uint32_t arena_id) {
  auto it = arenas_.find(arena_id);
  if (it == arenas_.end()) return absl::NotFoundError(absl::StrCat("no arena ", arena_id));
  if (it->second.used_pages != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena ", arena_id, " still holds ", it->second.used_pages, " pages"));
  }
  std::erase_if(free_superblocks_, [&](SbRef r) { return r.arena == arena_id; });
  num_vacating_ -= it->second.vacating;
  arena_bytes_ -= it->second.size_bytes;
  num_superblocks_ -= it->second.superblocks.size();
  arenas_.erase(it);
  return absl::OkStatus();
}

std::vector<uint32_t> PageAllocator::EmptyArenas() const {
  std::vector<uint32_t> out;
  for (const auto& [id, a] : arenas_) {
    if (a.used_pages == 0) out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status PageAllocator::Vacate(uint32_t arena_id) {
  auto it = arenas_.find(arena_id);
  if (it == arenas_.end()) return absl::NotFoundError(absl::StrCat("no arena ", arena_id));
  ArenaState& a = it->second;
  if (a.vacating) return absl::OkStatus();
  a.vacating = true;
  ++num_vacating_;
  std::erase_if(free_superblocks_, [&](SbRef r) { return r.arena == arena_id; });
  for (uint32_t i = 0; i < a.superblocks.size(); ++i) {
    Superblock& sb = a.superblocks[i];
    if (sb.in_class_list) UnlinkNonfull(sb.class_bytes, SbRef{arena_id, i});
  }
  return absl::OkStatus();
}

void PageAllocator::Unvacate(uint32_t arena_id) {
  auto it = arenas_.find(arena_id);
  if (it == arenas_.end() || !it->second.vacating) return;
  ArenaState& a = it->second;
  a.vacating = false;
  --num_vacating_;
  for (uint32_t i = static_cast<uint32_t>(a.superblocks.size()); i-- > 0;) {
    Superblock& sb = a.superblocks[i];
    if (sb.class_bytes == 0) {
      free_superblocks_.push_back(SbRef{arena_id, i});
    } else if (!sb.free_slots.empty()) {
      LinkNonfull(sb.class_bytes, SbRef{arena_id, i});
    }
  }
}

bool PageAllocator::Vacating(uint32_t arena_id) const {
  auto it = arenas_.find(arena_id);
  return it != arenas_.end() && it->second.vacating;
}

std::vector<PageAllocator::ArenaUse> PageAllocator::ArenaUses() const {
  std::vector<ArenaUse> out;
  out.reserve(arenas_.size());
  for (const auto& [id, a] : arenas_) {
    ArenaUse u{id, a.size_bytes, 0, a.vacating};
    for (const Superblock& sb : a.superblocks) u.used_superblocks += sb.class_bytes != 0;
    out.push_back(u);
  }
  std::sort(out.begin(), out.end(),
            [](const ArenaUse& x, const ArenaUse& y) { return x.arena_id < y.arena_id; });
  return out;
}

void PageAllocator::LinkNonfull(uint32_t class_bytes, SbRef r) {
  ClassState& c = classes_[class_bytes];
  Superblock& sb = Sb(r);
  sb.prev = SbRef{};
  sb.next = c.nonfull_head;
  if (c.nonfull_head.arena != 0) Sb(c.nonfull_head).prev = r;
  c.nonfull_head = r;
  sb.in_class_list = true;
}

void PageAllocator::UnlinkNonfull(uint32_t class_bytes, SbRef r) {
  ClassState& c = classes_[class_bytes];
  Superblock& sb = Sb(r);
  if (sb.prev.arena != 0) {
    Sb(sb.prev).next = sb.next;
  } else {
    c.nonfull_head = sb.next;
  }
  if (sb.next.arena != 0) Sb(sb.next).prev = sb.prev;
  sb.prev = sb.next = SbRef{};
  sb.in_class_list = false;
}

absl::StatusOr<PageId> PageAllocator::Alloc(uint64_t page_bytes) {
  if (page_bytes == 0) return absl::InvalidArgumentError("page size must be > 0");
  if (page_bytes > superblock_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page of ", page_bytes, " bytes is larger than a superblock (", superblock_bytes_,
        " bytes); raise superblock_bytes or use smaller block_tokens"));
  }
  const uint32_t cls = SizeClass(page_bytes);
  SbRef r = classes_[cls].nonfull_head;
  if (r.arena == 0) {
    if (free_superblocks_.empty()) {
      return absl::ResourceExhaustedError("no free superblock in this tenant's arenas");
    }
    r = free_superblocks_.back();
    free_superblocks_.pop_back();
    Superblock& sb = Sb(r);
    sb.class_bytes = cls;
    sb.capacity = static_cast<uint32_t>(superblock_bytes_ / cls);
    sb.used = 0;
    sb.allocated.assign(sb.capacity, false);
    sb.free_slots.resize(sb.capacity);
    // Slot 0 on top of the stack: pages fill a superblock front to back.
    for (uint32_t i = 0; i < sb.capacity; ++i) sb.free_slots[i] = sb.capacity - 1 - i;
    LinkNonfull(cls, r);
  }
  Superblock& sb = Sb(r);
  const uint32_t slot = sb.free_slots.back();
  sb.free_slots.pop_back();
  sb.allocated[slot] = true;
  ++sb.used;
  if (sb.free_slots.empty()) UnlinkNonfull(cls, r);
  ++arenas_.at(r.arena).used_pages;
  used_bytes_ += cls;
  ++num_pages_;
  return MakeId(r, slot);
}

PageLocation PageAllocator::LocationOf(PageId page, uint32_t class_bytes,
                                       uint64_t superblock_bytes) {
  const uint32_t arena = static_cast<uint32_t>(page >> 48);
  const uint64_t index = (page >> 24) & kMaxIndex;
  const uint64_t slot = page & kMaxIndex;
  // AddArena places superblock i at i * superblock_bytes.
  return PageLocation{arena, index * superblock_bytes + slot * class_bytes, class_bytes};
}

absl::StatusOr<std::pair<PageAllocator::SbRef, uint32_t>> PageAllocator::Resolve(
    PageId page) const {
  const uint32_t arena = static_cast<uint32_t>(page >> 48);
  const uint32_t index = static_cast<uint32_t>((page >> 24) & kMaxIndex);
  const uint32_t slot = static_cast<uint32_t>(page & kMaxIndex);
  auto it = arenas_.find(arena);
  if (it == arenas_.end() || index >= it->second.superblocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("page ", page, " does not exist"));
  }
  const Superblock& sb = it->second.superblocks[index];
  if (sb.class_bytes == 0 || slot >= sb.capacity || !sb.allocated[slot]) {
    return absl::InvalidArgumentError(absl::StrCat("page ", page, " is not allocated"));
  }
  return std::make_pair(SbRef{arena, index}, slot);
}

absl::Status PageAllocator::Free(PageId page) {
  auto resolved = Resolve(page);
  if (!resolved.ok()) return resolved.status();
  auto [r, slot] = *resolved;
  Superblock& sb = Sb(r);
  const uint32_t cls = sb.class_bytes;
  const bool was_full = sb.free_slots.empty();
  sb.allocated[slot] = false;
  sb.free_slots.push_back(slot);
  --sb.used;
  --arenas_.at(r.arena).used_pages;
  used_bytes_ -= cls;
  --num_pages_;
  const bool vacating = arenas_.at(r.arena).vacating;
  if (sb.used == 0) {
    // Give the whole superblock back so any size class can use it.
    if (sb.in_class_list) UnlinkNonfull(cls, r);
    sb.class_bytes = 0;
    sb.capacity = 0;
    sb.free_slots.clear();
    sb.free_slots.shrink_to_fit();
    sb.allocated.clear();
    sb.allocated.shrink_to_fit();
    if (!vacating) free_superblocks_.push_back(r);
  } else if (was_full && !vacating) {
    LinkNonfull(cls, r);
  }
  return absl::OkStatus();
}

absl::StatusOr<PageLocation> PageAllocator::Locate(PageId page) const {
  auto resolved = Resolve(page);
  if (!resolved.ok()) return resolved.status();
  auto [r, slot] = *resolved;
  const Superblock& sb = Sb(r);
  return PageLocation{r.arena, sb.offset + uint64_t(slot) * sb.class_bytes, sb.class_bytes};
}

uint64_t PageAllocator::FreePagesFor(uint64_t page_bytes) const {
  if (page_bytes == 0 || page_bytes > superblock_bytes_) return 0;
  const uint32_t cls = SizeClass(page_bytes);
  uint64_t n = free_superblocks_.size() * (superblock_bytes_ / cls);
  auto it = classes_.find(cls);
  if (it != classes_.end()) {
    for (SbRef r = it->second.nonfull_head; r.arena != 0; r = Sb(r).next) {
      n += Sb(r).free_slots.size();
    }
  }
  return n;
}

absl::Status PageAllocator::CheckInvariants() const {
  uint64_t used = 0, pages = 0, sbs = 0, free_sbs = 0, bytes = 0;
  for (const auto& [id, a] : arenas_) {
    uint64_t arena_pages = 0;
    bytes += a.size_bytes;
    sbs += a.superblocks.size();
    for (const Superblock& sb : a.superblocks) {
      if (sb.class_bytes == 0) {
        free_sbs += !a.vacating;
        if (sb.used != 0 || sb.in_class_list) {
          return absl::InternalError(absl::StrCat("free superblock of arena ", id, " in use"));
        }
        continue;
      }
      uint64_t set = std::count(sb.allocated.begin(), sb.allocated.end(), true);
      if (set != sb.used || sb.used + sb.free_slots.size() != sb.capacity || sb.used == 0) {
        return absl::InternalError(absl::StrCat("superblock slot counts broken in arena ", id));
      }
      if (sb.in_class_list != (!sb.free_slots.empty() && !a.vacating)) {
        return absl::InternalError("non-full superblock missing from its class list");
      }
      used += uint64_t(sb.used) * sb.class_bytes;
      pages += sb.used;
      arena_pages += sb.used;
    }
    if (arena_pages != a.used_pages) return absl::InternalError("arena page count broken");
  }
  if (free_sbs != free_superblocks_.size()) {
    return absl::InternalError(absl::StrCat("free superblock list has ", free_superblocks_.size(),
                                            " entries, recount ", free_sbs));
  }
  if (used != used_bytes_ || pages != num_pages_ || sbs != num_superblocks_ ||
      bytes != arena_bytes_) {
    return absl::InternalError(absl::StrCat("totals drifted: used ", used_bytes_, " vs ", used,
                                            ", pages ", num_pages_, " vs ", pages));
  }
  for (const auto& [cls, c] : classes_) {
    for (SbRef r = c.nonfull_head; r.arena != 0; r = Sb(r).next) {
      if (Sb(r).class_bytes != cls) return absl::InternalError("superblock in wrong class list");
    }
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
