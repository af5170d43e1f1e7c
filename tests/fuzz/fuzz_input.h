// FuzzInput: a fuzzer's bytes read as a short program of commands, so that
// one input can drive a sequence of calls (open, reserve, commit, sync...)
// against a fresh fixture and a crash reproduces from that input alone.
//
// Layout, repeated until the bytes run out:
//   [op: 1 byte][flags: 1 byte][length: 2 bytes, little endian][payload]
// A payload shorter than its length takes what is left. The meaning of op
// and flags is each target's (see its header comment).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace polykv::fuzz {

struct Command {
  uint8_t op = 0;
  uint8_t flags = 0;
  std::string_view payload;
};

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : rest_(reinterpret_cast<const char*>(data), size) {}

  // The next command; nullopt when fewer than 4 bytes are left.
  std::optional<Command> Next() {
    if (rest_.size() < 4) return std::nullopt;
    Command c;
    c.op = static_cast<uint8_t>(rest_[0]);
    c.flags = static_cast<uint8_t>(rest_[1]);
    const size_t len =
        static_cast<uint8_t>(rest_[2]) | (size_t{static_cast<uint8_t>(rest_[3])} << 8);
    rest_.remove_prefix(4);
    c.payload = rest_.substr(0, len);
    rest_.remove_prefix(c.payload.size());
    return c;
  }

 private:
  std::string_view rest_;
};

}  // namespace polykv::fuzz
