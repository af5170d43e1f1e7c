// Decoder of the Llama family over weights used in place from a GGUF file:
// "llama" (SmolLM2 and kin) and "qwen2" (Qwen2.5-Coder: Q/K/V biases,
// untied output head). Weights stay in their file encoding
// (weights/weight_matrix.h): decode steps multiply the quantized blocks with
// int8 activations, prefill dequantizes tiles and uses OpenBLAS sgemm.
//
// The cache holds keys in the Hugging Face layout (rotate-half RoPE: dims i
// and i + head_dim/2 form a pair), the layout other engines that share
// polykvd pages use. llama.cpp's converter permutes a "llama" file's Q and K
// rows into adjacent pairs; the forward pass undoes that on the projected
// vectors. "qwen2" rows are not permuted.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/worker/gguf.h"
#include "client/worker/kv_store.h"
#include "client/worker/weights/weight_matrix.h"

namespace polykv::worker {

struct ModelConfig {
  std::string architecture;  // "llama" or "qwen2"
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
  bool qkv_bias = false;          // qwen2: attn_{q,k,v}.bias.
  bool permuted_qk_rows = false;  // llama: GGUF Q/K rows in adjacent RoPE pairs.

  KvShape kv_shape() const { return {num_layers, num_kv_heads, head_dim}; }
};

struct ModelLoadOptions {
  // Decode steps (one token): int8 activations against the quantized blocks
  // (fast, llama.cpp's numerics) or exact f32 (prefill's numerics; tests that
  // compare decode with prefill use it).
  Activations decode = Activations::kInt8;
  // Threads of the shared kernel pool per matrix product (0 = all).
  int threads = 0;
};

// Immutable after Load; Forward is thread-safe (each call uses its own
// scratch and its own store), so one model serves many sequences.
class LlamaModel {
 public:
  // Reads config and weights; the model keeps `file` (its mapping holds the
  // weights). InvalidArgument for a different architecture, missing tensors,
  // wrong shapes or tensor types it cannot multiply.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(std::shared_ptr<const GgufFile> file,
                                                           const ModelLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  // Bytes of the weights a forward pass reads: matrices in their GGUF
  // encoding (mapped, not copied) plus the small f32 vectors (norms, biases)
  // copied at load.
  int64_t weight_bytes() const;
  const ModelLoadOptions& options() const { return options_; }

  // Runs one step: `tokens` (prefill chunk or one decode token) through all
  // layers, caching their K/V in `store`. Writes the logits of the last token
  // to `last_logits` ([vocab]) and, when non-null, of every token to
  // `all_logits` ([n, vocab]).
  // REQUIRES: store->shape() == config().kv_shape(); tokens non-empty.
  absl::Status Forward(std::span<const StepToken> tokens, KvStore* store,
                       std::vector<float>* last_logits,
                       std::vector<float>* all_logits = nullptr) const;

  // One decode step of several independent sequences: tokens[i] on
  // stores[i] (distinct stores), the weights read once for all of them.
  // logits: [n, vocab]; row i is what Forward() of tokens[i] alone on
  // stores[i] gives, bit for bit (the same products, row by row).
  absl::Status ForwardBatch(std::span<const StepToken> tokens, std::span<KvStore* const> stores,
                            std::vector<float>* logits) const;

 private:
  struct Layer {
    std::vector<float> attn_norm;  // [hidden]
    std::vector<float> ffn_norm;   // [hidden]
    // Empty without qkv_bias; else [heads * head_dim], [kv_heads * head_dim] x2.
    std::vector<float> q_bias, k_bias, v_bias;
    WeightMatrix q, k, v;    // [heads * head_dim | kv_heads * head_dim, hidden]
    WeightMatrix o;          // [hidden, heads * head_dim]
    WeightMatrix gate, up;   // [ffn_hidden, hidden]
    WeightMatrix down;       // [hidden, ffn_hidden]
  };
  LlamaModel() = default;

  // Y = X W^T (+ Y when accumulate): a matvec in `mode` for one row or for
  // rows of different sequences (`rows_apart`), the exact tiled sgemm for
  // more rows of one.
  void Project(const WeightMatrix& w, const float* x, int n, float* y, bool accumulate,
               Activations mode, bool rows_apart) const;
  // Forward and ForwardBatch: one store for every row, or one per row.
  absl::Status Run(std::span<const StepToken> tokens, std::span<KvStore* const> stores,
                   std::vector<float>* last_logits, std::vector<float>* all_logits) const;

  std::shared_ptr<const GgufFile> file_;
  ModelConfig config_;
  ModelLoadOptions options_;
  WeightMatrix embed_;              // [vocab, hidden]
  WeightMatrix output_;             // [vocab, hidden]; == embed_ when tied
  std::vector<float> output_norm_;  // [hidden]
  std::vector<Layer> layers_;
  std::vector<float> rope_inv_freq_;  // [head_dim / 2]
};

}  // namespace polykv::worker
