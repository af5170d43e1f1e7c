# Decides whether the CUDA backend is built. POLYKV_CUDA=AUTO builds it when nvcc
# is found (it must then compile and link even without a GPU: CI has no GPU);
# ON fails when nvcc is missing; OFF never builds it.
set(POLYKV_HAVE_CUDA OFF)
if(NOT POLYKV_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Hopper at least; CUDA 13 no longer targets the old default architectures.
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake 3.25 does not know how to ask nvcc 13 for C++20; device code is C++17.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(POLYKV_HAVE_CUDA ON)
  elseif(POLYKV_CUDA STREQUAL "ON")
    message(FATAL_ERROR "POLYKV_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "polykv: CUDA backend ${POLYKV_HAVE_CUDA}")
