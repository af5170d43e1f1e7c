// OpenBLAS picks its kernels once, when the library loads, from the CPU
// model; Debian 12's OpenBLAS (0.3.21) does not know recent Xeons and falls
// back to its Prescott (SSE3) kernels, which made the worker's prefill 2.5x
// slower here (sgemm_kernel_PRESCOTT at 73% of a prefill profile). Only the
// OPENBLAS_CORETYPE variable, read at load, changes the choice, so a process
// that finds the fallback on a CPU with AVX2/AVX-512 re-executes itself once
// with the variable set. An explicit OPENBLAS_CORETYPE is always respected.
#pragma once

namespace polykv::worker {

// Call first thing in main(). Returns only when no re-exec is needed or
// exec failed (then the process continues on the slow kernels, with a note
// on stderr).
void UseFastBlasKernels(char** argv);

}  // namespace polykv::worker
