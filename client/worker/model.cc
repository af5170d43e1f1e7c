#include "client/worker/model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/thread_pool.h"

namespace polykv::worker {
namespace {

#define RETURN_IF_ERROR_(expr)                              \
  do {                                                      \
    if (absl::Status s_ = (expr); !s_.ok()) return s_;      \
  } while (0)

// A "llama" GGUF holds each head's Q/K rows as adjacent RoPE pairs
// (2i, 2i+1); Hugging Face orders them as halves (i, i + d/2). Undo it on the
// projected vector v[num_heads * head_dim].
void UnpermuteHeads(float* v, int num_heads, int head_dim) {
  float tmp[512];
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h, v += head_dim) {
    std::memcpy(tmp, v, sizeof(float) * head_dim);
    for (int i = 0; i < half; ++i) {
      v[i] = tmp[2 * i];
      v[half + i] = tmp[2 * i + 1];
    }
  }
}

void AddBias(float* v, const std::vector<float>& bias, int n) {
  if (bias.empty()) return;
  for (int i = 0; i < n; ++i) {
    float* row = v + static_cast<size_t>(i) * bias.size();
    for (size_t j = 0; j < bias.size(); ++j) row[j] += bias[j];
  }
}

void RmsNorm(const float* x, const float* w, int n, float eps, float* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

// Rotate-half RoPE on one head vector v[d] at `pos`.
void Rope(float* v, int d, int pos, const float* inv_freq) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const float a = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(a), s = std::sin(a);
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x0 * s + x1 * c;
  }
}

}  // namespace

int64_t LlamaModel::weight_bytes() const {
  int64_t n = static_cast<int64_t>(embed_.bytes()) + output_norm_.size() * sizeof(float);
  if (!config_.tied_embeddings) n += static_cast<int64_t>(output_.bytes());
  for (const Layer& l : layers_) {
    for (const WeightMatrix* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      n += static_cast<int64_t>(w->bytes());
    }
    n += static_cast<int64_t>(sizeof(float)) *
         (l.attn_norm.size() + l.ffn_norm.size() + l.q_bias.size() + l.k_bias.size() +
          l.v_bias.size());
  }
  return n;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(std::shared_ptr<const GgufFile> file,
                                                             const ModelLoadOptions& options) {
  if (file == nullptr) return absl::InvalidArgumentError("LlamaModel::Load without a file");
  const GgufFile& f = *file;
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->file_ = std::move(file);
  m->options_ = options;
  ModelConfig& c = m->config_;
  auto arch = f.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama" && *arch != "qwen2") {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": architecture \"", *arch, "\" is not supported (supported: llama, qwen2)"));
  }
  c.architecture = *arch;
  c.permuted_qk_rows = *arch == "llama";
  c.qkv_bias = *arch == "qwen2";
  if (auto name = f.GetString("general.name"); name.ok()) c.name = *name;
  // Hyper-parameters live under the architecture's own prefix ("qwen2.").
  const std::string prefix = *arch + ".";
  auto geti = [&](const std::string& key, int* out) -> absl::Status {
    auto v = f.GetInt(prefix + key);
    if (!v.ok()) return v.status();
    if (*v <= 0 || *v > (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", prefix, key, " = ", *v));
    }
    *out = static_cast<int>(*v);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR_(geti("block_count", &c.num_layers));
  RETURN_IF_ERROR_(geti("embedding_length", &c.hidden));
  RETURN_IF_ERROR_(geti("attention.head_count", &c.num_heads));
  RETURN_IF_ERROR_(geti("feed_forward_length", &c.ffn_hidden));
  RETURN_IF_ERROR_(geti("context_length", &c.context_length));
  c.num_kv_heads = c.num_heads;
  if (f.Find(prefix + "attention.head_count_kv") != nullptr) {
    RETURN_IF_ERROR_(geti("attention.head_count_kv", &c.num_kv_heads));
  }
  if (c.hidden % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": inconsistent heads (hidden ", c.hidden, ", heads ", c.num_heads,
        ", kv heads ", c.num_kv_heads, ")"));
  }
  c.head_dim = c.hidden / c.num_heads;
  if (c.head_dim % 2 != 0 || c.head_dim > 512) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": head dimension ", c.head_dim, " is not supported"));
  }
  if (f.Find(prefix + "rope.dimension_count") != nullptr) {
    int rope_dims = 0;
    RETURN_IF_ERROR_(geti("rope.dimension_count", &rope_dims));
    if (rope_dims != c.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": partial RoPE (", rope_dims, " of ", c.head_dim, " dims) is not supported"));
    }
  }
  if (auto v = f.GetFloat(prefix + "rope.freq_base"); v.ok()) c.rope_base = static_cast<float>(*v);
  if (auto v = f.GetFloat(prefix + "attention.layer_norm_rms_epsilon"); v.ok()) {
    c.rms_eps = static_cast<float>(*v);
  }
  if (f.Find(prefix + "rope.scaling.type") != nullptr) {
    auto t = f.GetString(prefix + "rope.scaling.type");
    if (t.ok() && *t != "none") {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": RoPE scaling \"", *t, "\" is not supported"));
    }
  }
  const int64_t h = c.hidden, d = c.head_dim, nh = c.num_heads, kvh = c.num_kv_heads,
                ff = c.ffn_hidden;
  // A weight matrix [rows, cols] (GGUF dims {cols, rows}), used in place.
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols,
                    WeightMatrix* out) -> absl::Status {
    auto t = f.Tensor(name);
    if (!t.ok()) return t.status();
    if ((*t)->dims != std::vector<int64_t>{cols, rows}) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": tensor ", name, " has dims [", absl::StrJoin((*t)->dims, ", "),
          "], expected [", cols, ", ", rows, "]"));
    }
    auto w = WeightMatrix::FromGguf(**t);
    if (!w.ok()) return w.status();
    *out = *w;
    return absl::OkStatus();
  };
  auto embd = f.Tensor("token_embd.weight");
  if (!embd.ok()) return embd.status();
  if ((*embd)->dims.size() != 2 || (*embd)->dims[0] != c.hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": token_embd.weight has the wrong shape"));
  }
  c.vocab_size = static_cast<int>((*embd)->dims[1]);
  const int64_t vocab = c.vocab_size;
  RETURN_IF_ERROR_(matrix("token_embd.weight", vocab, h, &m->embed_));
  if (f.tensors().count("output.weight") != 0) {
    RETURN_IF_ERROR_(matrix("output.weight", vocab, h, &m->output_));
  } else {
    c.tied_embeddings = true;
    m->output_ = m->embed_;
  }
  RETURN_IF_ERROR_(f.ReadF32("output_norm.weight", {h}, &m->output_norm_));

  m->layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = m->layers_[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    RETURN_IF_ERROR_(f.ReadF32(p + "attn_norm.weight", {h}, &L.attn_norm));
    RETURN_IF_ERROR_(f.ReadF32(p + "ffn_norm.weight", {h}, &L.ffn_norm));
    RETURN_IF_ERROR_(matrix(p + "attn_q.weight", nh * d, h, &L.q));
    RETURN_IF_ERROR_(matrix(p + "attn_k.weight", kvh * d, h, &L.k));
    RETURN_IF_ERROR_(matrix(p + "attn_v.weight", kvh * d, h, &L.v));
    if (c.qkv_bias) {
      RETURN_IF_ERROR_(f.ReadF32(p + "attn_q.bias", {nh * d}, &L.q_bias));
      RETURN_IF_ERROR_(f.ReadF32(p + "attn_k.bias", {kvh * d}, &L.k_bias));
      RETURN_IF_ERROR_(f.ReadF32(p + "attn_v.bias", {kvh * d}, &L.v_bias));
    }
    RETURN_IF_ERROR_(matrix(p + "attn_output.weight", h, nh * d, &L.o));
    RETURN_IF_ERROR_(matrix(p + "ffn_gate.weight", ff, h, &L.gate));
    RETURN_IF_ERROR_(matrix(p + "ffn_up.weight", ff, h, &L.up));
    RETURN_IF_ERROR_(matrix(p + "ffn_down.weight", h, ff, &L.down));
  }
  // Computed in f32 the way the reference implementations do.
  m->rope_inv_freq_.resize(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    m->rope_inv_freq_[i] =
        1.0f / std::pow(c.rope_base, static_cast<float>(2 * i) / static_cast<float>(d));
  }
  // The model runs its products on the kernels' pool, one sgemm per thread.
  openblas_set_num_threads(1);
  return m;
}

void LlamaModel::Project(const WeightMatrix& w, const float* x, int n, float* y, bool accumulate,
                         Activations mode, bool rows_apart) const {
  if (n == 1) {
    w.MatVec(x, y, accumulate, mode, options_.threads);
  } else if (rows_apart) {
    w.MatVecBatch(x, n, y, accumulate, mode, options_.threads);
  } else {
    w.MatMul(x, n, y, accumulate ? 1.0f : 0.0f, options_.threads);
  }
}

absl::Status LlamaModel::Forward(std::span<const StepToken> tokens, KvStore* store,
                                 std::vector<float>* last_logits,
                                 std::vector<float>* all_logits) const {
  KvStore* const stores[] = {store};
  return Run(tokens, stores, last_logits, all_logits);
}

absl::Status LlamaModel::ForwardBatch(std::span<const StepToken> tokens,
                                      std::span<KvStore* const> stores,
                                      std::vector<float>* logits) const {
  if (tokens.size() != stores.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: ", tokens.size(), " tokens for ",
                                                   stores.size(), " stores"));
  }
  for (size_t i = 0; i < stores.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (stores[i] == stores[j]) {
        return absl::InvalidArgumentError("ForwardBatch: one store twice (one token per store)");
      }
    }
  }
  return Run(tokens, stores, nullptr, logits);
}

absl::Status LlamaModel::Run(std::span<const StepToken> tokens, std::span<KvStore* const> stores,
                             std::vector<float>* last_logits,
                             std::vector<float>* all_logits) const {
  const ModelConfig& c = config_;
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("Forward with no tokens");
  for (KvStore* store : stores) {
    if (store == nullptr) return absl::InvalidArgumentError("Forward without a KV store");
    const KvShape& ks = store->shape();
    if (ks.num_layers != c.num_layers || ks.num_kv_heads != c.num_kv_heads ||
        ks.head_dim != c.head_dim) {
      return absl::InvalidArgumentError("KV store shape does not match the model");
    }
  }
  // One store per row: decode steps of different sequences.
  const bool apart = stores.size() > 1;
  for (const StepToken& t : tokens) {
    if (t.token_id < 0 || t.token_id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t.token_id, " out of range"));
    }
    if (t.position < 0) return absl::InvalidArgumentError("negative position");
  }
  const int hd = c.hidden, d = c.head_dim, nh = c.num_heads, kvh = c.num_kv_heads,
            ff = c.ffn_hidden;
  std::vector<float> x(static_cast<size_t>(n) * hd), hbuf(x.size()),
      q(static_cast<size_t>(n) * nh * d), k(static_cast<size_t>(n) * kvh * d), v(k.size()),
      attn(q.size()), gate(static_cast<size_t>(n) * ff), up(gate.size());
  for (int i = 0; i < n; ++i) {
    embed_.DequantizeRows(tokens[i].token_id, 1, x.data() + static_cast<size_t>(i) * hd);
  }
  // Decode steps take the configured (fast) numerics; prefill stays exact,
  // down to the last token's logits.
  const Activations mode = n == 1 || apart ? options_.decode : Activations::kF32;
  if (apart) {
    for (int i = 0; i < n; ++i) RETURN_IF_ERROR_(stores[i]->BeginStep(tokens.subspan(i, 1)));
  } else {
    RETURN_IF_ERROR_(stores[0]->BeginStep(tokens));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    for (int i = 0; i < n; ++i) {
      RmsNorm(&x[static_cast<size_t>(i) * hd], L.attn_norm.data(), hd, c.rms_eps,
              &hbuf[static_cast<size_t>(i) * hd]);
    }
    Project(L.q, hbuf.data(), n, q.data(), false, mode, apart);
    Project(L.k, hbuf.data(), n, k.data(), false, mode, apart);
    Project(L.v, hbuf.data(), n, v.data(), false, mode, apart);
    AddBias(q.data(), L.q_bias, n);
    AddBias(k.data(), L.k_bias, n);
    AddBias(v.data(), L.v_bias, n);
    for (int i = 0; i < n; ++i) {
      float* qi = &q[static_cast<size_t>(i) * nh * d];
      float* ki = &k[static_cast<size_t>(i) * kvh * d];
      if (c.permuted_qk_rows) {
        UnpermuteHeads(qi, nh, d);
        UnpermuteHeads(ki, kvh, d);
      }
      for (int hh = 0; hh < nh; ++hh) Rope(qi + hh * d, d, tokens[i].position, rope_inv_freq_.data());
      for (int hh = 0; hh < kvh; ++hh) Rope(ki + hh * d, d, tokens[i].position, rope_inv_freq_.data());
    }
    if (apart) {
      // Each sequence's attention on its own store, the sequences spread over
      // the threads (a store's kernels called from here run serially).
      std::vector<absl::Status> row_status(static_cast<size_t>(n));
      kernels::cpu::ThreadPool::Shared().ParallelFor(n, options_.threads, [&](int i) {
        const size_t qo = static_cast<size_t>(i) * nh * d, ko = static_cast<size_t>(i) * kvh * d;
        absl::Status st = stores[i]->Append(l, k.data() + ko, v.data() + ko);
        if (st.ok()) st = stores[i]->Attend(l, nh, q.data() + qo, attn.data() + qo);
        row_status[static_cast<size_t>(i)] = std::move(st);
      });
      for (absl::Status& st : row_status) RETURN_IF_ERROR_(st);
    } else {
      RETURN_IF_ERROR_(stores[0]->Append(l, k.data(), v.data()));
      RETURN_IF_ERROR_(stores[0]->Attend(l, nh, q.data(), attn.data()));
    }
    Project(L.o, attn.data(), n, x.data(), true, mode, apart);  // Residual.
    for (int i = 0; i < n; ++i) {
      RmsNorm(&x[static_cast<size_t>(i) * hd], L.ffn_norm.data(), hd, c.rms_eps,
              &hbuf[static_cast<size_t>(i) * hd]);
    }
    Project(L.gate, hbuf.data(), n, gate.data(), false, mode, apart);
    Project(L.up, hbuf.data(), n, up.data(), false, mode, apart);
    for (size_t j = 0; j < gate.size(); ++j) {
      gate[j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];  // SiLU(g) * u
    }
    Project(L.down, gate.data(), n, x.data(), true, mode, apart);  // Residual.
  }
  for (KvStore* store : stores) RETURN_IF_ERROR_(store->EndStep());

  const int first = all_logits != nullptr ? 0 : n - 1;
  const int rows = n - first;
  for (int i = first; i < n; ++i) {
    RmsNorm(&x[static_cast<size_t>(i) * hd], output_norm_.data(), hd, c.rms_eps,
            &hbuf[static_cast<size_t>(i - first) * hd]);
  }
  std::vector<float> logits(static_cast<size_t>(rows) * c.vocab_size);
  Project(output_, hbuf.data(), rows, logits.data(), false, mode, apart);
  if (last_logits != nullptr) {
    last_logits->assign(logits.end() - c.vocab_size, logits.end());
  }
  if (all_logits != nullptr) *all_logits = std::move(logits);
  return absl::OkStatus();
}

}  // namespace polykv::worker
