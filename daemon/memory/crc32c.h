// CRC-32C (Castagnoli), the checksum of offloaded pages on disk: the SSE4.2
// instruction where the CPU has it (chosen at run time; the build targets a
// baseline without it), a table otherwise. Same value either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace polykv::daemon {

// Continues `crc` (0 to start) over `bytes`.
uint32_t Crc32c(std::span<const std::byte> bytes, uint32_t crc = 0);

}  // namespace polykv::daemon
