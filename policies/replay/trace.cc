#include "policies/replay/trace.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "policies/replay/json.h"
#include "policies/tagger.h"

namespace polykv::policies::replay {
namespace {

// A per-layer stream: a number (same for every layer) or an array [L].
bool Stream(const Json* j, int layers, std::vector<float>* out) {
  out->assign(layers, 0.f);
  if (j == nullptr) return true;
  if (j->type == Json::Type::kNumber) {
    out->assign(layers, static_cast<float>(j->num));
    return true;
  }
  if (j->type != Json::Type::kArray || static_cast<int>(j->arr.size()) != layers) return false;
  for (int l = 0; l < layers; ++l) {
    if (j->arr[l].type != Json::Type::kNumber) return false;
    (*out)[l] = static_cast<float>(j->arr[l].num);
  }
  return true;
}

double Num(const Json& o, const char* key, double def) {
  const Json* j = o.get(key);
  return j != nullptr && j->type == Json::Type::kNumber ? j->num : def;
}

std::string Str(const Json& o, const char* key, const std::string& def) {
  const Json* j = o.get(key);
  return j != nullptr && j->type == Json::Type::kString ? j->str : def;
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
    auto parsed = ParseJson(line);
    if (!parsed.ok()) return bad(std::string(parsed.status().message()));
    const Json& o = *parsed;
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
      if (const Json* e = o.get("layer_entropy"); e != nullptr) {
        if (!Stream(e, layers, &ent)) return bad("layer_entropy must be [num_layers]");
        for (int l = 0; l < layers; ++l) v.layers[l].entropy = ent[l];
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
    const Json* boundary = o.get("boundary");
    m.tag.boundary = boundary != nullptr && boundary->b;
    const Json* pinned = o.get("pinned");
    m.pinned = pinned != nullptr && pinned->b;
    v.current_turn = std::max(v.current_turn, m.turn);
    std::vector<float> attn, obs, intent, count, present;
    if (!Stream(o.get("attn"), layers, &attn) || !Stream(o.get("obs"), layers, &obs) ||
        !Stream(o.get("intent"), layers, &intent)) {
      return bad("attn / obs / intent must be a number or [num_layers] numbers");
    }
    if (!Stream(o.get("count"), layers, &count)) return bad("count must be [num_layers]");
    if (o.get("present") != nullptr) {
      if (!Stream(o.get("present"), layers, &present)) return bad("present must be [num_layers]");
    } else {
      present.assign(layers, 1.f);
    }
    const Json* key = o.get("key");
    if (key != nullptr && v.key_dim > 0) {
      if (key->type != Json::Type::kArray || static_cast<int>(key->arr.size()) != layers) {
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
      s.attn = attn[l];
      s.obs = obs[l];
      s.intent = intent[l];
      s.k_format = kf;
      s.v_format = vf;
      v.layers[l].slots.push_back(s);
      if (v.key_dim > 0) {
        if (key == nullptr) {
          v.layers[l].keys.insert(v.layers[l].keys.end(), v.key_dim, 0.f);
        } else {
          const Json& row = key->arr[l];
          if (row.type != Json::Type::kArray || static_cast<int>(row.arr.size()) != v.key_dim) {
            return bad("key rows must have key_dim numbers");
          }
          for (const Json& x : row.arr) v.layers[l].keys.push_back(static_cast<float>(x.num));
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
  std::string out = absl::StrCat(
      "{\"type\":\"header\",\"version\":1,\"num_layers\":", L, ",\"key_dim\":", view.key_dim,
      ",\"block_tokens\":", view.shape.block_tokens, ",\"num_kv_heads\":", view.shape.num_kv_heads,
      ",\"head_dim\":", view.shape.head_dim, ",\"k_format\":\"bf16\",\"v_format\":\"bf16\"");
  out += ",\"layer_entropy\":[";
  for (int l = 0; l < L; ++l) absl::StrAppend(&out, l ? "," : "", view.layers[l].entropy);
  out += "]}\n";
  // slot index of each token per layer (-1 = absent)
  std::vector<std::vector<int64_t>> where(L, std::vector<int64_t>(view.tokens.size(), -1));
  for (int l = 0; l < L; ++l) {
    for (size_t i = 0; i < view.layers[l].slots.size(); ++i) {
      where[l][view.layers[l].slots[i].token] = static_cast<int64_t>(i);
    }
  }
  char buf[32];
  auto f = [&](float x) {
    std::snprintf(buf, sizeof(buf), "%.6g", x);
    return std::string(buf);
  };
  for (size_t t = 0; t < view.tokens.size(); ++t) {
    const TokenMeta& m = view.tokens[t];
    absl::StrAppend(&out, "{\"type\":\"token\",\"pos\":", m.position, ",\"turn\":", m.turn,
                    ",\"role\":\"", std::string(RoleName(m.role)), "\",\"kind\":\"",
                    std::string(BlockKindName(m.tag.kind)), "\",\"block\":", m.tag.block_id,
                    ",\"depth\":", m.tag.depth,
                    ",\"boundary\":", m.tag.boundary ? "true" : "false");
    if (m.pinned) out += ",\"pinned\":true";
    if (t < texts.size()) absl::StrAppend(&out, ",\"text\":\"", JsonEscape(texts[t]), "\"");
    bool all = true, any_count = false;
    for (int l = 0; l < L; ++l) {
      all &= where[l][t] >= 0;
      any_count |= where[l][t] >= 0 && view.layers[l].slots[where[l][t]].count != 1;
    }
    auto stream = [&](const char* name, auto get) {
      absl::StrAppend(&out, ",\"", name, "\":[");
      for (int l = 0; l < L; ++l) {
        out += l ? "," : "";
        out += where[l][t] >= 0 ? get(view.layers[l].slots[where[l][t]]) : "0";
      }
      out += "]";
    };
    stream("attn", [&](const Slot& s) { return f(s.attn); });
    stream("obs", [&](const Slot& s) { return f(s.obs); });
    stream("intent", [&](const Slot& s) { return f(s.intent); });
    if (any_count) stream("count", [&](const Slot& s) { return absl::StrCat(s.count); });
    if (!all) {
      out += ",\"present\":[";
      for (int l = 0; l < L; ++l) absl::StrAppend(&out, l ? "," : "", where[l][t] >= 0 ? 1 : 0);
      out += "]";
    }
    if (view.key_dim > 0) {
      out += ",\"key\":[";
      for (int l = 0; l < L; ++l) {
        out += l ? ",[" : "[";
        for (int j = 0; j < view.key_dim; ++j) {
          out += j ? "," : "";
          out += where[l][t] >= 0 && !view.layers[l].keys.empty() ? f(view.key(l, where[l][t])[j])
                                                                  : "0";
        }
        out += "]";
      }
      out += "]";
    }
    out += "}\n";
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
    v.layers[l].entropy = in.entropy;
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
