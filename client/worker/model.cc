#include "client/worker/model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace polykv::worker {
namespace {

#define RETURN_IF_ERROR_(expr)                              \
  do {                                                      \
    if (absl::Status s_ = (expr); !s_.ok()) return s_;      \
  } while (0)

// GGUF (llama.cpp) orders each head's Q/K rows as adjacent RoPE pairs
// (2i, 2i+1); Hugging Face orders them as halves (i, i + d/2). Undo it.
// w: [num_heads * head_dim, cols], permuted in place.
void UnpermuteRows(std::vector<float>* w, int num_heads, int head_dim, int cols) {
  std::vector<float> head(static_cast<size_t>(head_dim) * cols);
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* base = w->data() + static_cast<size_t>(h) * head_dim * cols;
    std::memcpy(head.data(), base, head.size() * sizeof(float));
    for (int i = 0; i < half; ++i) {
      for (int p = 0; p < 2; ++p) {
        std::memcpy(base + static_cast<size_t>(p * half + i) * cols,
                    head.data() + static_cast<size_t>(2 * i + p) * cols, cols * sizeof(float));
      }
    }
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

// Y[n, out] = X[n, in] . W[out, in]^T + beta * Y
void MatMulT(const float* x, int n, int in, const float* w, int out, float beta, float* y) {
  if (n == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, beta, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, beta,
                y, out);
  }
}

}  // namespace

int64_t LlamaModel::weight_bytes() const {
  int64_t n = embed_.size() + output_.size() + output_norm_.size();
  for (const Layer& l : layers_) {
    n += l.attn_norm.size() + l.wqkv.size() + l.wo.size() + l.ffn_norm.size() +
         l.w_gate_up.size() + l.w_down.size();
  }
  return n * int64_t{sizeof(float)};
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const GgufFile& f,
                                                             const ModelLoadOptions& options) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  ModelConfig& c = m->config_;
  auto arch = f.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": architecture \"", *arch, "\" is not supported (supported: llama)"));
  }
  c.architecture = *arch;
  if (auto name = f.GetString("general.name"); name.ok()) c.name = *name;
  auto geti = [&](const std::string& key, int* out) -> absl::Status {
    auto v = f.GetInt("llama." + key);
    if (!v.ok()) return v.status();
    if (*v <= 0 || *v > (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": llama.", key, " = ", *v));
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
  if (f.Find("llama.attention.head_count_kv") != nullptr) {
    RETURN_IF_ERROR_(geti("attention.head_count_kv", &c.num_kv_heads));
  }
  if (c.hidden % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": inconsistent heads (hidden ", c.hidden, ", heads ", c.num_heads,
        ", kv heads ", c.num_kv_heads, ")"));
  }
  c.head_dim = c.hidden / c.num_heads;
  if (f.Find("llama.rope.dimension_count") != nullptr) {
    int rope_dims = 0;
    RETURN_IF_ERROR_(geti("rope.dimension_count", &rope_dims));
    if (rope_dims != c.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": partial RoPE (", rope_dims, " of ", c.head_dim, " dims) is not supported"));
    }
  }
  if (auto v = f.GetFloat("llama.rope.freq_base"); v.ok()) c.rope_base = static_cast<float>(*v);
  if (auto v = f.GetFloat("llama.attention.layer_norm_rms_epsilon"); v.ok()) {
    c.rms_eps = static_cast<float>(*v);
  }
  if (f.Find("llama.rope.scaling.type") != nullptr) {
    auto t = f.GetString("llama.rope.scaling.type");
    if (t.ok() && *t != "none") {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": RoPE scaling \"", *t, "\" is not supported"));
    }
  }
  auto embd = f.Tensor("token_embd.weight");
  if (!embd.ok()) return embd.status();
  if ((*embd)->dims.size() != 2 || (*embd)->dims[0] != c.hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": token_embd.weight has the wrong shape"));
  }
  c.vocab_size = static_cast<int>((*embd)->dims[1]);
  const int64_t h = c.hidden, d = c.head_dim, nh = c.num_heads, kvh = c.num_kv_heads,
                ff = c.ffn_hidden, vocab = c.vocab_size;
  RETURN_IF_ERROR_(f.ReadF32("token_embd.weight", {h, vocab}, &m->embed_));
  if (f.tensors().count("output.weight") != 0) {
    RETURN_IF_ERROR_(f.ReadF32("output.weight", {h, vocab}, &m->output_));
  } else {
    c.tied_embeddings = true;
  }
  RETURN_IF_ERROR_(f.ReadF32("output_norm.weight", {h}, &m->output_norm_));

  m->layers_.resize(c.num_layers);
  std::vector<float> q, k, v, gate, up;
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = m->layers_[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    RETURN_IF_ERROR_(f.ReadF32(p + "attn_norm.weight", {h}, &L.attn_norm));
    RETURN_IF_ERROR_(f.ReadF32(p + "ffn_norm.weight", {h}, &L.ffn_norm));
    RETURN_IF_ERROR_(f.ReadF32(p + "attn_q.weight", {h, nh * d}, &q));
    RETURN_IF_ERROR_(f.ReadF32(p + "attn_k.weight", {h, kvh * d}, &k));
    RETURN_IF_ERROR_(f.ReadF32(p + "attn_v.weight", {h, kvh * d}, &v));
    UnpermuteRows(&q, c.num_heads, c.head_dim, c.hidden);
    UnpermuteRows(&k, c.num_kv_heads, c.head_dim, c.hidden);
    L.wqkv.reserve(q.size() + k.size() + v.size());
    L.wqkv.insert(L.wqkv.end(), q.begin(), q.end());
    L.wqkv.insert(L.wqkv.end(), k.begin(), k.end());
    L.wqkv.insert(L.wqkv.end(), v.begin(), v.end());
    RETURN_IF_ERROR_(f.ReadF32(p + "attn_output.weight", {nh * d, h}, &L.wo));
    RETURN_IF_ERROR_(f.ReadF32(p + "ffn_gate.weight", {h, ff}, &gate));
    RETURN_IF_ERROR_(f.ReadF32(p + "ffn_up.weight", {h, ff}, &up));
    L.w_gate_up.reserve(gate.size() + up.size());
    L.w_gate_up.insert(L.w_gate_up.end(), gate.begin(), gate.end());
    L.w_gate_up.insert(L.w_gate_up.end(), up.begin(), up.end());
    RETURN_IF_ERROR_(f.ReadF32(p + "ffn_down.weight", {ff, h}, &L.w_down));
  }
  if (options.quantized_decode) {
    // Output row r of a Q/K matrix takes GGUF row (head, 2i + p) for
    // r = (head, p * d/2 + i): the same un-permutation as UnpermuteRows.
    auto order = [&](int heads) {
      std::vector<int> o(static_cast<size_t>(heads) * d);
      for (int hh = 0; hh < heads; ++hh) {
        for (int p = 0; p < 2; ++p) {
          for (int i = 0; i < d / 2; ++i) o[hh * d + p * (d / 2) + i] = hh * d + 2 * i + p;
        }
      }
      return o;
    };
    const std::vector<int> q_order = order(c.num_heads), k_order = order(c.num_kv_heads);
    bool all = true;
    for (int l = 0; l < c.num_layers && all; ++l) {
      const std::string p = absl::StrCat("blk.", l, ".");
      std::vector<QMatrix> qs;
      for (const char* name : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                               "ffn_down"}) {
        auto t = f.Tensor(p + name + ".weight");
        if (!t.ok() || !QMatrix::Supports((*t)->type)) {
          all = false;
          break;
        }
        const std::string n = name;
        auto qm = QMatrix::FromGguf(**t, n == "attn_q" ? &q_order : n == "attn_k" ? &k_order : nullptr);
        if (!qm.ok()) return qm.status();
        qs.push_back(*std::move(qm));
      }
      if (all) m->layers_[l].q = std::move(qs);
    }
    auto out = f.Tensor(c.tied_embeddings ? "token_embd.weight" : "output.weight");
    if (all && out.ok() && QMatrix::Supports((*out)->type)) {
      auto qm = QMatrix::FromGguf(**out);
      if (!qm.ok()) return qm.status();
      m->q_output_.push_back(*std::move(qm));
    }
    if (!all) {
      for (Layer& L : m->layers_) L.q.clear();  // All or nothing: one code path per step.
    }
  }
  // Computed in f32 the way the reference implementations do.
  m->rope_inv_freq_.resize(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    m->rope_inv_freq_[i] =
        1.0f / std::pow(c.rope_base, static_cast<float>(2 * i) / static_cast<float>(d));
  }
  return m;
}

absl::Status LlamaModel::Forward(std::span<const TokenMeta> tokens, KvStore* store,
                                 std::vector<float>* last_logits,
                                 std::vector<float>* all_logits) const {
  const ModelConfig& c = config_;
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("Forward with no tokens");
  const KvShape& ks = store->shape();
  if (ks.num_layers != c.num_layers || ks.num_kv_heads != c.num_kv_heads ||
      ks.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV store shape does not match the model");
  }
  for (const TokenMeta& t : tokens) {
    if (t.token_id < 0 || t.token_id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t.token_id, " out of range"));
    }
    if (t.position < 0) return absl::InvalidArgumentError("negative position");
  }
  const int hd = c.hidden, d = c.head_dim, nh = c.num_heads, kvh = c.num_kv_heads,
            ff = c.ffn_hidden;
  const int qkv_cols = (nh + 2 * kvh) * d;
  std::vector<float> x(static_cast<size_t>(n) * hd), hbuf(x.size()),
      qkv(static_cast<size_t>(n) * qkv_cols), q(static_cast<size_t>(n) * nh * d),
      k(static_cast<size_t>(n) * kvh * d), v(k.size()), attn(q.size()),
      gu(static_cast<size_t>(n) * 2 * ff), act(static_cast<size_t>(n) * ff);
  for (int i = 0; i < n; ++i) {
    std::memcpy(x.data() + static_cast<size_t>(i) * hd,
                embed_.data() + static_cast<size_t>(tokens[i].token_id) * hd, hd * sizeof(float));
  }
  RETURN_IF_ERROR_(store->BeginStep(tokens));
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    for (int i = 0; i < n; ++i) {
      RmsNorm(&x[static_cast<size_t>(i) * hd], L.attn_norm.data(), hd, c.rms_eps,
              &hbuf[static_cast<size_t>(i) * hd]);
    }
    const bool quant = n == 1 && !L.q.empty();
    if (quant) {
      L.q[0].MatVec(hbuf.data(), qkv.data(), false);
      L.q[1].MatVec(hbuf.data(), qkv.data() + nh * d, false);
      L.q[2].MatVec(hbuf.data(), qkv.data() + (nh + kvh) * d, false);
    } else {
      MatMulT(hbuf.data(), n, hd, L.wqkv.data(), qkv_cols, 0.0f, qkv.data());
    }
    for (int i = 0; i < n; ++i) {
      const float* row = &qkv[static_cast<size_t>(i) * qkv_cols];
      float* qi = &q[static_cast<size_t>(i) * nh * d];
      float* ki = &k[static_cast<size_t>(i) * kvh * d];
      std::memcpy(qi, row, sizeof(float) * nh * d);
      std::memcpy(ki, row + nh * d, sizeof(float) * kvh * d);
      std::memcpy(&v[static_cast<size_t>(i) * kvh * d], row + (nh + kvh) * d,
                  sizeof(float) * kvh * d);
      for (int hh = 0; hh < nh; ++hh) Rope(qi + hh * d, d, tokens[i].position, rope_inv_freq_.data());
      for (int hh = 0; hh < kvh; ++hh) Rope(ki + hh * d, d, tokens[i].position, rope_inv_freq_.data());
    }
    RETURN_IF_ERROR_(store->Append(l, k.data(), v.data()));
    RETURN_IF_ERROR_(store->Attend(l, nh, q.data(), attn.data()));
    if (quant) {
      L.q[3].MatVec(attn.data(), x.data(), true);  // Residual.
    } else {
      MatMulT(attn.data(), n, nh * d, L.wo.data(), hd, 1.0f, x.data());  // Residual.
    }
    for (int i = 0; i < n; ++i) {
      RmsNorm(&x[static_cast<size_t>(i) * hd], L.ffn_norm.data(), hd, c.rms_eps,
              &hbuf[static_cast<size_t>(i) * hd]);
    }
    if (quant) {
      L.q[4].MatVec(hbuf.data(), gu.data(), false);
      L.q[5].MatVec(hbuf.data(), gu.data() + ff, false);
    } else {
      MatMulT(hbuf.data(), n, hd, L.w_gate_up.data(), 2 * ff, 0.0f, gu.data());
    }
    for (int i = 0; i < n; ++i) {
      const float* g = &gu[static_cast<size_t>(i) * 2 * ff];
      const float* u = g + ff;
      float* a = &act[static_cast<size_t>(i) * ff];
      for (int j = 0; j < ff; ++j) a[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];  // SiLU(g)*u
    }
    if (quant) {
      L.q[6].MatVec(act.data(), x.data(), true);  // Residual.
    } else {
      MatMulT(act.data(), n, ff, L.w_down.data(), hd, 1.0f, x.data());  // Residual.
    }
  }
  RETURN_IF_ERROR_(store->EndStep());

  const float* wout = output_.empty() ? embed_.data() : output_.data();
  const int first = all_logits != nullptr ? 0 : n - 1;
  const int rows = n - first;
  for (int i = first; i < n; ++i) {
    RmsNorm(&x[static_cast<size_t>(i) * hd], output_norm_.data(), hd, c.rms_eps,
            &hbuf[static_cast<size_t>(i - first) * hd]);
  }
  std::vector<float> logits(static_cast<size_t>(rows) * c.vocab_size);
  if (rows == 1 && n == 1 && !q_output_.empty()) {
    q_output_[0].MatVec(hbuf.data(), logits.data(), false);
  } else {
    MatMulT(hbuf.data(), rows, hd, wout, c.vocab_size, 0.0f, logits.data());
  }
  if (last_logits != nullptr) {
    last_logits->assign(logits.end() - c.vocab_size, logits.end());
  }
  if (all_logits != nullptr) *all_logits = std::move(logits);
  return absl::OkStatus();
}

}  // namespace polykv::worker
