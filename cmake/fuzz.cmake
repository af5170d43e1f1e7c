# POLYKV_FUZZ=ON: the libFuzzer build of tests/fuzz/ (scripts/fuzz.sh makes
# one in build-fuzz/). Every unit of ours is compiled with coverage
# instrumentation for libFuzzer and with ASan and UBSan, so a fuzz input that
# overflows a buffer or hits undefined behaviour anywhere in the daemon
# aborts; Debian's gRPC, protobuf and abseil are linked uninstrumented.
# Needs clang and its fuzzer runtime (libclang-rt or clang's own on Debian).
option(POLYKV_FUZZ "Build tests/fuzz with libFuzzer, ASan and UBSan (clang only)" OFF)
# ASan costs the gRPC-level target ~40x (25 exec/s on 2 loaded cores): a long
# run of it may drop to UBSan alone (-DPOLYKV_FUZZ_SANITIZERS=undefined).
set(POLYKV_FUZZ_SANITIZERS "address,undefined" CACHE STRING
    "Sanitizers of the fuzz build, besides libFuzzer's coverage")
if(POLYKV_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "POLYKV_FUZZ=ON needs clang: "
                        "-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,${POLYKV_FUZZ_SANITIZERS}
                      -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${POLYKV_FUZZ_SANITIZERS})
endif()
