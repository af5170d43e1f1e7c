#include "client/worker/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>

namespace polykv::worker {

void UseFastBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = openblas_get_corename();
  if (core == nullptr) return;
  const bool fallback = std::strcmp(core, "Prescott") == 0 || std::strcmp(core, "Core2") == 0 ||
                        std::strcmp(core, "Nehalem") == 0;
  if (!fallback) return;
  const char* want = nullptr;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    want = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    want = "Haswell";
  }
#endif
  if (want == nullptr) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "note: OpenBLAS chose its %s kernels and re-executing with "
               "OPENBLAS_CORETYPE=%s failed (%s); continuing on the slow ones\n",
               core, want, std::strerror(errno));
}

}  // namespace polykv::worker
