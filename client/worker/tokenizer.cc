#include "client/worker/tokenizer.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "client/worker/unicode_nfc.h"
#include "client/worker/utf8.h"

namespace polykv::worker {
namespace {

struct CodepointRange {
  uint32_t first;
  uint32_t last;
};
#include "client/worker/unicode_tables.inc"

template <size_t N>
bool InRanges(const CodepointRange (&ranges)[N], uint32_t cp) {
  const CodepointRange* end = ranges + N;
  const CodepointRange* it = std::upper_bound(
      ranges, end, cp, [](uint32_t v, const CodepointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

// One decoded code point and the bytes it came from.
struct Cp {
  uint32_t cp;
  uint32_t offset;
  uint32_t len;
};

// Marks a byte that is not valid UTF-8: tokenized alone, as "other".
constexpr uint32_t kInvalidCp = 0xFFFFFFFF;

std::vector<Cp> DecodeUtf8(std::string_view s) {
  std::vector<Cp> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const int len = DecodeUtf8At(s, i, &cp);
    if (len == 0) {
      out.push_back({kInvalidCp, static_cast<uint32_t>(i), 1});
      ++i;
    } else {
      out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
      i += len;
    }
  }
  return out;
}

bool IsL(uint32_t cp) { return cp != kInvalidCp && IsUnicodeLetter(cp); }
bool IsN(uint32_t cp) { return cp != kInvalidCp && IsUnicodeNumber(cp); }
bool IsS(uint32_t cp) { return cp != kInvalidCp && IsUnicodeWhitespace(cp); }
bool IsOther(uint32_t cp) { return !IsS(cp) && !IsL(cp) && !IsN(cp); }

// Length (in code points) of the GPT-2 pattern's match at cps[i..end).
size_t MatchGpt2(const std::vector<Cp>& cps, size_t i, size_t end) {
  const uint32_t c = cps[i].cp;
  // 's|'t|'re|'ve|'m|'ll|'d  (case-sensitive, as in the reference).
  if (c == '\'' && i + 1 < end) {
    const uint32_t a = cps[i + 1].cp;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 < end) {
      const uint32_t b = cps[i + 2].cp;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return 3;
      }
    }
  }
  // ' ?X+' for X in \p{L}, \p{N}, [^\s\p{L}\p{N}]: the optional space is
  // U+0020 only; without it the run must start at i (a space never starts one).
  const size_t j = (c == ' ' && i + 1 < end) ? i + 1 : i;
  for (bool (*cls)(uint32_t) : {&IsL, &IsN, &IsOther}) {
    if (cls(cps[j].cp)) {
      size_t k = j + 1;
      while (k < end && cls(cps[k].cp)) ++k;
      return k - i;
    }
  }
  // \s+(?!\S) then \s+.
  size_t k = i;
  while (k < end && IsS(cps[k].cp)) ++k;
  if (k == i) return 1;  // Unreachable for valid classes; keep progress.
  if (k == end) return k - i;
  if (k - i >= 2) return k - 1 - i;  // Leave the last space to prefix the word.
  return 1;
}

bool IsNewline(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// What (?i:x) matches for the ASCII letters of the contractions: the ASCII
// case pair, and U+017F LONG S, whose case folding is 's'.
uint32_t FoldContractionLetter(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + ('a' - 'A');
  return cp == 0x17F ? 's' : cp;
}

// Length (in code points) of the Qwen2 pattern's match at cps[i..end):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Alternatives are tried in order (leftmost-first), as Oniguruma does.
size_t MatchQwen2(const std::vector<Cp>& cps, size_t i, size_t end) {
  const uint32_t c = cps[i].cp;
  if (c == '\'' && i + 1 < end) {
    const uint32_t a = FoldContractionLetter(cps[i + 1].cp);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 < end) {
      const uint32_t b = FoldContractionLetter(cps[i + 2].cp);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return 3;
      }
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+ : one leading char of any other kind (a space,
  // a tab, punctuation) joins the letters after it.
  size_t j = i;
  if (!IsL(c) && !IsN(c) && !IsNewline(c) && i + 1 < end && IsL(cps[i + 1].cp)) j = i + 1;
  if (IsL(cps[j].cp)) {
    size_t k = j + 1;
    while (k < end && IsL(cps[k].cp)) ++k;
    return k - i;
  }
  if (IsN(c)) return 1;  // \p{N}: one digit per piece.
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  j = (c == ' ' && i + 1 < end && IsOther(cps[i + 1].cp)) ? i + 1 : i;
  if (IsOther(cps[j].cp)) {
    size_t k = j + 1;
    while (k < end && IsOther(cps[k].cp)) ++k;
    while (k < end && IsNewline(cps[k].cp)) ++k;
    return k - i;
  }
  // c is whitespace. \s*[\r\n]+ : through the run's last \r or \n.
  size_t k = i;
  while (k < end && IsS(cps[k].cp)) ++k;
  for (size_t p = k; p > i; --p) {
    if (IsNewline(cps[p - 1].cp)) return p - i;
  }
  // \s+(?!\S) then \s+, as for GPT-2.
  if (k == end) return k - i;
  if (k - i >= 2) return k - 1 - i;
  return 1;
}

// GPT-2 byte-to-unicode map: printable bytes map to themselves, the others
// to U+0100 upwards, so every byte is one visible character.
void ByteLevelChars(uint32_t out[256]) {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                           (b >= 0xAE && b <= 0xFF);
    out[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
  }
}

constexpr int32_t kTokenTypeControl = 3;
constexpr int32_t kTokenTypeUserDefined = 4;

}  // namespace

bool IsUnicodeLetter(uint32_t cp) { return InRanges(kLetterRanges, cp); }
bool IsUnicodeNumber(uint32_t cp) { return InRanges(kNumberRanges, cp); }
bool IsUnicodeWhitespace(uint32_t cp) {
  // The Unicode White_Space property, which \s matches in the reference.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  const std::string& path = file.path();
  absl::StatusOr<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": tokenizer.ggml.model is \"", *model,
        "\"; only byte-level BPE (\"gpt2\") is supported"));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  std::string pre = "default";
  if (auto p = file.GetString("tokenizer.ggml.pre"); p.ok()) pre = *p;
  if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    t->pre_ = PreTokenizer::kSmolLm;
  } else if (pre == "gpt-2" || pre == "default") {
    t->pre_ = PreTokenizer::kGpt2;
  } else if (pre == "qwen2") {
    t->pre_ = PreTokenizer::kQwen2;
    t->nfc_ = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": tokenizer.ggml.pre \"", pre,
        "\" is not supported (supported: smollm, starcoder, refact, gpt-2, default, qwen2)"));
  }
  auto tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  t->tokens_ = **tokens;
  const int32_t n = static_cast<int32_t>(t->tokens_.size());
  t->token_types_.assign(n, 1);
  if (auto types = file.GetIntArray("tokenizer.ggml.token_type"); types.ok()) {
    if (static_cast<int32_t>((*types)->size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tokenizer.ggml.token_type has ", (*types)->size(),
          " entries for ", n, " tokens"));
    }
    for (int32_t i = 0; i < n; ++i) t->token_types_[i] = static_cast<int32_t>((**types)[i]);
  }
  t->token_ids_.reserve(n);
  for (int32_t i = 0; i < n; ++i) t->token_ids_.emplace(std::string_view(t->tokens_[i]), i);

  uint32_t chars[256];
  ByteLevelChars(chars);
  int num_bytes = 0;
  std::fill(std::begin(t->byte_of_char_), std::end(t->byte_of_char_), -1);
  for (int b = 0; b < 256; ++b) {
    t->byte_of_char_[chars[b]] = b;
    std::string s;
    AppendUtf8(chars[b], &s);
    // Some vocabularies lack a few bytes (SmolLM2: control bytes such as
    // 0x04 and bytes that never occur in UTF-8). The reference BPE has no
    // unknown token and no byte fallback, so it drops them; so do we.
    t->byte_token_[b] = t->TokenId(s);
    if (t->byte_token_[b] >= 0) ++num_bytes;
  }
  if (num_bytes < 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": vocabulary has tokens for only ", num_bytes,
        " of 256 bytes; not a byte-level BPE vocabulary"));
  }

  auto merges = file.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();
  t->merges_.reserve((*merges)->size());
  std::string merged;  // Reused: no allocation per merge.
  for (size_t rank = 0; rank < (*merges)->size(); ++rank) {
    const std::string& m = (**merges)[rank];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": merge #", rank, " \"", m, "\" has no space"));
    }
    const std::string_view a = std::string_view(m).substr(0, sp);
    const std::string_view b = std::string_view(m).substr(sp + 1);
    merged.assign(a).append(b);
    const int32_t ia = t->TokenId(a), ib = t->TokenId(b), im = t->TokenId(merged);
    if (ia < 0 || ib < 0 || im < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": merge #", rank, " \"", m, "\" names a token not in the vocabulary"));
    }
    const uint64_t key = (static_cast<uint64_t>(ia) << 32) | static_cast<uint32_t>(ib);
    // First (lowest-rank) occurrence wins, as in the reference.
    t->merges_.emplace(key, (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(im));
  }

  for (int32_t i = 0; i < n; ++i) {
    if (t->token_types_[i] == kTokenTypeControl ||
        t->token_types_[i] == kTokenTypeUserDefined) {
      if (!t->tokens_[i].empty()) t->specials_.emplace_back(t->tokens_[i], i);
    }
  }
  std::stable_sort(t->specials_.begin(), t->specials_.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  if (auto v = file.GetInt("tokenizer.ggml.bos_token_id"); v.ok()) t->bos_id_ = static_cast<int32_t>(*v);
  if (auto v = file.GetInt("tokenizer.ggml.eos_token_id"); v.ok()) t->eos_id_ = static_cast<int32_t>(*v);
  for (int32_t id : {t->bos_id_, t->eos_id_}) {
    if (id >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": special token id ", id, " is outside the vocabulary"));
    }
  }
  return t;
}

int32_t Tokenizer::TokenId(std::string_view token) const {
  auto it = token_ids_.find(token);
  return it == token_ids_.end() ? -1 : it->second;
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && token_types_[id] == kTokenTypeControl;
}

std::vector<std::string> Tokenizer::PreTokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  const std::vector<Cp> cps = DecodeUtf8(text);
  auto bytes = [&](size_t a, size_t b) {  // Code points [a, b) as bytes.
    return std::string(text.substr(cps[a].offset, cps[b - 1].offset + cps[b - 1].len - cps[a].offset));
  };
  auto split_gpt2 = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      const size_t len = MatchGpt2(cps, i, end);
      pieces.push_back(bytes(i, i + len));
      i += len;
    }
  };
  if (pre_ == PreTokenizer::kGpt2) {
    split_gpt2(0, cps.size());
    return pieces;
  }
  if (pre_ == PreTokenizer::kQwen2) {
    for (size_t i = 0; i < cps.size();) {
      const size_t len = MatchQwen2(cps, i, cps.size());
      pieces.push_back(bytes(i, i + len));
      i += len;
    }
    return pieces;
  }
  // Digits(individual_digits): every \p{N} is its own piece; the text between
  // them is split by the GPT-2 pattern independently.
  size_t start = 0;
  for (size_t i = 0; i <= cps.size(); ++i) {
    if (i == cps.size() || IsN(cps[i].cp)) {
      if (i > start) split_gpt2(start, i);
      if (i < cps.size()) pieces.push_back(bytes(i, i + 1));
      start = i + 1;
    }
  }
  return pieces;
}

void Tokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  std::vector<int32_t> sym;
  sym.reserve(piece.size());
  for (char ch : piece) {
    const int32_t id = byte_token_[static_cast<uint8_t>(ch)];
    if (id >= 0) sym.push_back(id);
  }
  // Repeatedly merge the lowest-rank adjacent pair (leftmost on ties).
  while (sym.size() > 1) {
    uint64_t best = std::numeric_limits<uint64_t>::max();
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const uint64_t key = (static_cast<uint64_t>(sym[i]) << 32) | static_cast<uint32_t>(sym[i + 1]);
      auto it = merges_.find(key);
      if (it != merges_.end() && it->second < best) {
        best = it->second;
        best_i = i;
      }
    }
    if (best == std::numeric_limits<uint64_t>::max()) break;
    sym[best_i] = static_cast<int32_t>(best & 0xFFFFFFFFu);
    sym.erase(sym.begin() + best_i + 1);
  }
  out->insert(out->end(), sym.begin(), sym.end());
}

void Tokenizer::EncodeText(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  if (nfc_) {
    for (const std::string& piece : PreTokenize(NormalizeNfc(text))) EncodePiece(piece, out);
    return;
  }
  for (const std::string& piece : PreTokenize(text)) EncodePiece(piece, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  if (!parse_special || specials_.empty()) {
    EncodeText(text, &out);
    return out;
  }
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    size_t hit_len = 0;
    for (const auto& [s, id] : specials_) {  // Longest first.
      if (text.compare(i, s.size(), s) == 0) {
        hit = id;
        hit_len = s.size();
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    EncodeText(text.substr(start, i - start), &out);
    out.push_back(hit);
    i += hit_len;
    start = i;
  }
  EncodeText(text.substr(start), &out);
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (token_types_[id] == kTokenTypeControl || token_types_[id] == kTokenTypeUserDefined) {
      if (!skip_special || token_types_[id] == kTokenTypeUserDefined) out += tokens_[id];
      continue;
    }
    for (const Cp& c : DecodeUtf8(tokens_[id])) {
      const int b = c.cp < 0x200 ? byte_of_char_[c.cp] : -1;
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
      } else {  // Not a byte-level char: keep the text as is.
        out.append(tokens_[id], c.offset, c.len);
      }
    }
  }
  return out;
}

}  // namespace polykv::worker
