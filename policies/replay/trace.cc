#include "policies/replay/trace.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "policies/tagger.h"

namespace polykv::policies::replay {
namespace {

using Json = nlohmann::ordered_json;

// A per-layer stream: a number (same for every layer) or an array [L].
bool Stream(const Json* j, int layers, std::vector<float>* out) {
  out->assign(layers, 0.f);
  if (j == nullptr) return true;
  if (j->is_number()) {
    out->assign(layers, j->get<float>());
    return true;
  }
  if (!j->is_array() || static_cast<int>(j->size()) != layers) return false;
  for (int l = 0; l < layers; ++l) {
    if (!(*j)[l].is_number()) return false;
    (*out)[l] = (*j)[l].get<float>();
  }
  return true;
}

// The member `key`, or null when absent.
const Json* Get(const Json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

double Num(const Json& o, const char* key, double def) {
  const Json* j = Get(o, key);
  return j != nullptr && j->is_number() ? j->get<double>() : def;
}

std::string Str(const Json& o, const char* key, const std::string& def) {
  const Json* j = Get(o, key);
  return j != nullptr && j->is_string() ? j->get<std::string>() : def;
}

bool Bool(const Json& o, const char* key) {
  const Json* j = Get(o, key);
  return j != nullptr && j->is_boolean() && j->get<bool>();
}

// A stream value as WriteTrace has always written it: six significant digits.
double Six(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return std::strtod(buf, nullptr);
}

}  // namespace

absl::StatusOr<Trace> ParseTrace(std::string_view jsonl) {
  Trace t;
  SessionView& v = t.view;
  int layers = -1;
  kernels::PageFormat kf = kernels::PageFormat::kBF16, vf = kernels::PageFormat::kBF16;
  size_t line_no = 0, start = 0;
  while (start < jsonl.size()) {
    size_t end = jsonl.find('\n', start);
    if (end == std::string_view::npos) end = jsonl.size();
    const std::string_view line = jsonl.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no, ": ", what));
    };
    const Json o = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (o.is_discarded()) return bad("not a JSON value");
    if (!o.is_object()) return bad("expected a JSON object");
    const std::string type = Str(o, "type", "");
    if (type == "header") {
      layers = static_cast<int>(Num(o, "num_layers", -1));
      if (layers <= 0 || layers > 4096) return bad("num_layers must be in [1, 4096]");
      v.layers.resize(layers);
      t.present.resize(layers);
      v.key_dim = static_cast<int>(Num(o, "key_dim", 0));
      v.shape.block_tokens = static_cast<int>(Num(o, "block_tokens", 16));
      v.shape.num_kv_heads = static_cast<int>(Num(o, "num_kv_heads", 8));
      v.shape.head_dim = static_cast<int>(Num(o, "head_dim", 128));
      auto k = kernels::ParseFormat(Str(o, "k_format", "bf16"));
      auto vv = kernels::ParseFormat(Str(o, "v_format", "bf16"));
      if (!k || !vv) return bad("unknown k_format / v_format");
      kf = *k;
      vf = *vv;
      std::vector<float> ent;
      if (const Json* e = Get(o, "layer_entropy"); e != nullptr) {
        if (!Stream(e, layers, &ent)) return bad("layer_entropy must be [num_layers]");
        // Unknown is NaN in the view, -1 in traces (JSON has no NaN).
        for (int l = 0; l < layers; ++l) {
          v.layers[l].score[ScoreStream::kEntropy] = ent[l] < 0 ? kUnreported : ent[l];
        }
      }
      continue;
    }
    if (type != "token") return bad(absl::StrCat("unknown record type '", type, "'"));
    if (layers < 0) return bad("token before header");
    TokenMeta m;
    m.position = static_cast<int64_t>(Num(o, "pos", static_cast<double>(v.tokens.size())));
    m.turn = static_cast<int32_t>(Num(o, "turn", 0));
    auto role = ParseRole(Str(o, "role", "user"));
    if (!role) return bad("unknown role");
    m.role = *role;
    auto kind = ParseBlockKind(Str(o, "kind", "none"));
    if (!kind) return bad("unknown kind");
    m.tag.kind = *kind;
    m.tag.block_id = static_cast<uint32_t>(Num(o, "block", 0));
    m.tag.depth = static_cast<uint16_t>(Num(o, "depth", 0));
    m.tag.boundary = Bool(o, "boundary");
    m.pinned = Bool(o, "pinned");
    v.current_turn = std::max(v.current_turn, m.turn);
    std::vector<float> attn, obs, intent, importance, count, present;
    if (!Stream(Get(o, "attn"), layers, &attn) || !Stream(Get(o, "obs"), layers, &obs) ||
        !Stream(Get(o, "intent"), layers, &intent) ||
        !Stream(Get(o, "importance"), layers, &importance)) {
      return bad("attn / obs / intent / importance must be a number or [num_layers] numbers");
    }
    if (!Stream(Get(o, "count"), layers, &count)) return bad("count must be [num_layers]");
    if (Get(o, "present") != nullptr) {
      if (!Stream(Get(o, "present"), layers, &present)) return bad("present must be [num_layers]");
    } else {
      present.assign(layers, 1.f);
    }
    const Json* key = Get(o, "key");
    if (key != nullptr && v.key_dim > 0) {
      if (!key->is_array() || static_cast<int>(key->size()) != layers) {
        return bad("key must be [num_layers][key_dim]");
      }
    }
    const uint32_t index = static_cast<uint32_t>(v.tokens.size());
    v.tokens.push_back(m);
    t.texts.push_back(Str(o, "text", ""));
    for (int l = 0; l < layers; ++l) {
      t.present[l].push_back(present[l] != 0.f);
      if (present[l] == 0.f) continue;
      Slot s;
      s.token = index;
      s.count = count[l] >= 1.f ? static_cast<uint32_t>(count[l]) : 1u;
      s.score[ScoreStream::kAttention] = attn[l];
      s.score[ScoreStream::kObservation] = obs[l];
      s.score[ScoreStream::kIntent] = intent[l];
      s.score[ScoreStream::kImportance] = importance[l];
      s.k_format = kf;
      s.v_format = vf;
      v.layers[l].slots.push_back(s);
      if (v.key_dim > 0) {
        if (key == nullptr) {
          v.layers[l].keys.insert(v.layers[l].keys.end(), v.key_dim, 0.f);
        } else {
          const Json& row = (*key)[l];
          if (!row.is_array() || static_cast<int>(row.size()) != v.key_dim) {
            return bad("key rows must have key_dim numbers");
          }
          for (const Json& x : row) {
            if (!x.is_number()) return bad("key rows must have key_dim numbers");
            v.layers[l].keys.push_back(x.get<float>());
          }
        }
      }
    }
  }
  if (layers < 0) return absl::InvalidArgumentError("trace has no header");
  if (auto st = ValidateView(v); !st.ok()) return st;
  return t;
}

std::string WriteTrace(const SessionView& view, const std::vector<std::string>& texts) {
  const int L = view.num_layers();
  Json header = {{"type", "header"},
                 {"version", 1},
                 {"num_layers", L},
                 {"key_dim", view.key_dim},
                 {"block_tokens", view.shape.block_tokens},
                 {"num_kv_heads", view.shape.num_kv_heads},
                 {"head_dim", view.shape.head_dim},
                 {"k_format", "bf16"},
                 {"v_format", "bf16"}};
  Json& entropy = header["layer_entropy"] = Json::array();
  for (int l = 0; l < L; ++l) {
    const float e = view.layers[l].score[ScoreStream::kEntropy];
    entropy.push_back(std::isnan(e) ? -1.f : e);
  }
  std::string out = header.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  // slot index of each token per layer (-1 = absent)
  std::vector<std::vector<int64_t>> where(L, std::vector<int64_t>(view.tokens.size(), -1));
  for (int l = 0; l < L; ++l) {
    for (size_t i = 0; i < view.layers[l].slots.size(); ++i) {
      where[l][view.layers[l].slots[i].token] = static_cast<int64_t>(i);
    }
  }
  for (size_t t = 0; t < view.tokens.size(); ++t) {
    const TokenMeta& m = view.tokens[t];
    Json rec = {{"type", "token"},
                {"pos", m.position},
                {"turn", m.turn},
                {"role", std::string(RoleName(m.role))},
                {"kind", std::string(BlockKindName(m.tag.kind))},
                {"block", m.tag.block_id},
                {"depth", m.tag.depth},
                {"boundary", m.tag.boundary}};
    if (m.pinned) rec["pinned"] = true;
    if (t < texts.size()) rec["text"] = texts[t];
    bool all = true, any_count = false, any_importance = false;
    for (int l = 0; l < L; ++l) {
      all &= where[l][t] >= 0;
      any_count |= where[l][t] >= 0 && view.layers[l].slots[where[l][t]].count != 1;
      any_importance |= where[l][t] >= 0 &&
                        view.layers[l].slots[where[l][t]].score[ScoreStream::kImportance] != 0.f;
    }
    auto stream = [&](const char* name, auto get) {
      Json& a = rec[name] = Json::array();
      for (int l = 0; l < L; ++l) {
        if (where[l][t] >= 0) a.push_back(get(view.layers[l].slots[where[l][t]]));
        else a.push_back(0);
      }
    };
    stream("attn", [&](const Slot& s) { return Six(s.score[ScoreStream::kAttention]); });
    stream("obs", [&](const Slot& s) { return Six(s.score[ScoreStream::kObservation]); });
    stream("intent", [&](const Slot& s) { return Six(s.score[ScoreStream::kIntent]); });
    // Only workers that reconstruct report it; older traces stay as they were.
    if (any_importance) {
      stream("importance", [&](const Slot& s) { return Six(s.score[ScoreStream::kImportance]); });
    }
    if (any_count) stream("count", [&](const Slot& s) { return s.count; });
    if (!all) {
      Json& present = rec["present"] = Json::array();
      for (int l = 0; l < L; ++l) present.push_back(where[l][t] >= 0 ? 1 : 0);
    }
    if (view.key_dim > 0) {
      Json& key = rec["key"] = Json::array();
      for (int l = 0; l < L; ++l) {
        Json row = Json::array();
        for (int j = 0; j < view.key_dim; ++j) {
          const bool have = where[l][t] >= 0 && !view.layers[l].keys.empty();
          row.push_back(have ? Six(view.key(l, where[l][t])[j]) : 0.0);
        }
        key.push_back(std::move(row));
      }
    }
    out += rec.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  }
  return out;
}

void Retag(Trace* trace) {
  StructureTagger tagger;
  int32_t turn = -1;
  for (size_t i = 0; i < trace->view.tokens.size(); ++i) {
    const TokenMeta& m = trace->view.tokens[i];
    if (m.turn != turn && turn >= 0) tagger.EndMessage();
    turn = m.turn;
    tagger.Feed(trace->texts[i], m.role);
  }
  tagger.EndMessage();
  for (size_t i = 0; i < trace->view.tokens.size(); ++i) {
    trace->view.tokens[i].tag = tagger.tags()[i];
  }
}

SessionView Prefix(const Trace& trace, size_t n) {
  SessionView v;
  v.tokens.assign(trace.view.tokens.begin(), trace.view.tokens.begin() + n);
  v.key_dim = trace.view.key_dim;
  v.shape = trace.view.shape;
  for (const TokenMeta& m : v.tokens) v.current_turn = std::max(v.current_turn, m.turn);
  v.layers.resize(trace.view.layers.size());
  const size_t d = static_cast<size_t>(v.key_dim);
  for (size_t l = 0; l < v.layers.size(); ++l) {
    const LayerView& in = trace.view.layers[l];
    v.layers[l].score = in.score;
    for (size_t i = 0; i < in.slots.size() && in.slots[i].token < n; ++i) {
      v.layers[l].slots.push_back(in.slots[i]);
      if (d > 0 && !in.keys.empty()) {
        v.layers[l].keys.insert(v.layers[l].keys.end(), in.keys.begin() + i * d,
                                in.keys.begin() + (i + 1) * d);
      }
    }
  }
  return v;
}

}  // namespace polykv::policies::replay
