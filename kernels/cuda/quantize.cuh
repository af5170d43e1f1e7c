// Internal to kernels/cuda: launchers shared between the .cu files.
#pragma once

#include <cuda_runtime.h>

#include "kernels/page_layout.h"

namespace polykv::kernels::cuda {

// Encodes dense rows [num_rows][H][D] (device) into the pages of a block table
// (device array of num_blocks entries), each page in its entry's format.
int LaunchQuantizeTable(cudaStream_t stream, const float* rows, int num_rows, const PageGeom& g,
                        KvKind kind, uint8_t* base, const BlockEntry* blocks, int num_blocks);

}  // namespace polykv::kernels::cuda
