// Byte-level BPE tokenizer built from a GGUF file's vocabulary and merges
// (tokenizer.ggml.model == "gpt2"), with the pre-tokenizer the file names in
// tokenizer.ggml.pre. Matches Hugging Face `tokenizers` for
//  * SmolLM2 ("smollm": individual digits, then the GPT-2 split pattern
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ )
//  * Qwen2 ("qwen2": NFC, then
//      (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//       ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ )
// with the patterns implemented by hand over Unicode tables, no regex library.
// The tables are Python's unicodedata (14.0); the reference's Oniguruma has
// Unicode 16.0, so ~9,400 letters and digits assigned since count as "other"
// here (scripts/make-qwen-tokenizer-fixture.py counts them).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "client/worker/gguf.h"

namespace polykv::worker {

// Unicode helpers (exposed for tests).
bool IsUnicodeLetter(uint32_t cp);      // \p{L}
bool IsUnicodeNumber(uint32_t cp);      // \p{N}
bool IsUnicodeWhitespace(uint32_t cp);  // \s (White_Space property)

// Immutable after construction; Encode/Decode are thread-safe.
class Tokenizer {
 public:
  enum class PreTokenizer {
    kGpt2,     // GPT-2 pattern only ("gpt-2", "default").
    kSmolLm,   // Each \p{N} alone, then the GPT-2 pattern ("smollm", "starcoder").
    kQwen2,    // The Qwen2 pattern, on NFC text ("qwen2").
  };

  // Builds the tokenizer from tokenizer.ggml.{model,pre,tokens,token_type,merges,
  // bos_token_id,eos_token_id}. InvalidArgument for models other than "gpt2",
  // unknown pre-tokenizers, or merges that name tokens not in the vocabulary.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Encodes UTF-8 text. With `parse_special`, control tokens written in the
  // text (e.g. "<|im_start|>") become their ids, as Hugging Face does for
  // added special tokens; without it they are tokenized as plain text.
  // Invalid UTF-8 bytes are kept and tokenized as single bytes. For "qwen2"
  // the text between special tokens is NFC-normalized first (special tokens
  // are matched in the raw text, as Hugging Face does for added tokens).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // Concatenated bytes of the tokens; control tokens are rendered as their
  // text unless `skip_special`. May end inside a UTF-8 sequence.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // One token's text, special tokens dropped: what the structure tagger reads
  // (the worker's SlotTagger tags these texts).
  std::string TokenText(int32_t id) const { return Decode(std::span(&id, 1), /*skip_special=*/true); }

  // Splits `text` the way the pre-tokenizer does (no special-token handling,
  // no normalization).
  std::vector<std::string> PreTokenize(std::string_view text) const;

  PreTokenizer pre_tokenizer() const { return pre_; }
  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  // Id of a token by its vocabulary string, or -1.
  int32_t TokenId(std::string_view token) const;
  bool IsControl(int32_t id) const;
  const std::string& TokenString(int32_t id) const { return tokens_[id]; }

 private:
  Tokenizer() = default;
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;
  void EncodeText(std::string_view text, std::vector<int32_t>* out) const;

  PreTokenizer pre_ = PreTokenizer::kGpt2;
  bool nfc_ = false;  // Normalize text segments to NFC before splitting.
  std::vector<std::string> tokens_;
  std::vector<int32_t> token_types_;
  // Keys view tokens_, which never changes after construction. Flat maps and
  // views (no per-token strings) keep FromGguf fast for 150K-token vocabularies.
  absl::flat_hash_map<std::string_view, int32_t> token_ids_;
  // (left id << 32 | right id) -> (rank << 32 | merged id).
  absl::flat_hash_map<uint64_t, uint64_t> merges_;
  int32_t byte_token_[256] = {};        // Token id of each byte; -1: none (dropped).
  int byte_of_char_[0x200] = {};        // Byte-level char (< 0x200) -> byte, -1 if none.
  std::vector<std::pair<std::string, int32_t>> specials_;  // Longest first.
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
};

}  // namespace polykv::worker
