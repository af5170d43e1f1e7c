// Llama-architecture decoder (SmolLM2 and kin) over weights from a GGUF file,
// dequantized to f32 at load and multiplied with OpenBLAS.
//
// GGUF stores Q and K rows permuted for llama.cpp's adjacent-pair RoPE; the
// loader undoes that permutation, so the cache holds keys in the Hugging Face
// layout (rotate-half RoPE: dims i and i + head_dim/2 form a pair), the layout
// other engines that share polykvd pages use.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/worker/gguf.h"
#include "client/worker/kv_store.h"
#include "client/worker/qmatvec.h"

namespace polykv::worker {

struct ModelConfig {
  std::string architecture;  // "llama"
  std::string name;
  int num_layers = 0;
  int hidden = 0;        // d_model
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int ffn_hidden = 0;
  int vocab_size = 0;
  int context_length = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;

  KvShape kv_shape() const { return {num_layers, num_kv_heads, head_dim}; }
};

struct ModelLoadOptions {
  // Decode steps (one token) multiply straight from the GGUF's quantized
  // blocks (qmatvec.h) instead of the f32 weights; prefill always uses BLAS.
  bool quantized_decode = true;
};

// Immutable after Load; Forward is thread-safe (each call uses its own
// scratch and its own store), so one model serves many sequences.
class LlamaModel {
 public:
  // Reads config and weights. InvalidArgument for a different architecture,
  // missing tensors or wrong shapes.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const GgufFile& file,
                                                           const ModelLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  // Bytes of f32 weights held.
  int64_t weight_bytes() const;

  // Runs one step: `tokens` (prefill chunk or one decode token) through all
  // layers, caching their K/V in `store`. Writes the logits of the last token
  // to `last_logits` ([vocab]) and, when non-null, of every token to
  // `all_logits` ([n, vocab]).
  // REQUIRES: store->shape() == config().kv_shape(); tokens non-empty.
  absl::Status Forward(std::span<const TokenMeta> tokens, KvStore* store,
                       std::vector<float>* last_logits,
                       std::vector<float>* all_logits = nullptr) const;

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [hidden]
    std::vector<float> wqkv;       // [(heads + 2 * kv_heads) * head_dim, hidden]
    std::vector<float> wo;         // [hidden, heads * head_dim]
    std::vector<float> ffn_norm;   // [hidden]
    std::vector<float> w_gate_up;  // [2 * ffn_hidden, hidden]: gate rows, then up rows
    std::vector<float> w_down;     // [hidden, ffn_hidden]
    // Decode path (empty when the tensor type is not block-quantized):
    // q, k, v, o, gate, up, down.
    std::vector<QMatrix> q;
  };
  LlamaModel() = default;

  ModelConfig config_;
  std::vector<float> embed_;       // [vocab, hidden]
  std::vector<float> output_;      // [vocab, hidden]; empty when tied to embed_
  std::vector<float> output_norm_; // [hidden]
  std::vector<Layer> layers_;
  std::vector<float> rope_inv_freq_;  // [head_dim / 2]
  std::vector<QMatrix> q_output_;     // Quantized output head (decode), or empty.
};

}  // namespace polykv::worker
