// ModelProfile: the KV cache shape of one model, as a worker declares it
// when it opens a session and the daemon sizes its pages by it (the client
// API and the pool share this one type; the wire has proto's ModelProfile).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/page_format.h"

namespace polykv::kernels {

struct ModelProfile {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kF16;  // the worker's compute dtype (its default page format)
  std::string model_id;       // names the model; never interpreted
};

}  // namespace polykv::kernels
