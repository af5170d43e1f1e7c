#include "daemon/pool/token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace polykv::daemon {

absl::StatusOr<std::string> NewToken() {
  std::string token(kTokenBytes, '\0');
  size_t got = 0;
  while (got < kTokenBytes) {
    ssize_t n = getrandom(token.data() + got, kTokenBytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return token;
}

bool TokenEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

uint32_t DrawInstance() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != sizeof(v)) v = static_cast<uint32_t>(time(nullptr));
  return v == 0 ? 1 : v;
}

}  // namespace polykv::daemon
