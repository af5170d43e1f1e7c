// Incremental structural tagger (CodeComp): token pieces in, StructTags out.
//
// The worker feeds every token as it is written — its decoded text piece and
// the role of the message it belongs to — and reports the tags as slot
// metadata. The tagger tracks, with line-level rules and no full parser:
//   * agent markup: tool_call messages, tool outputs, error output (by role,
//     by <tool_call>/<tool_output>/<tool_response> tags, and by error lines
//     such as tracebacks, "error:", "panic:", "FAILED" inside tool outputs);
//   * code in fenced blocks (```lang) of any message and in tool outputs, for
//     Python, JavaScript/TypeScript, Java, C/C++, Go and Rust: imports,
//     signatures (with decorators/attributes and multi-line parameter lists),
//     class-like declarations, bodies, comments and docstrings, module-level
//     statements; nesting depth from braces or indentation.
//
// Block ids: one per function body, class declaration, comment run, import
// run, statement run, prose paragraph, tool call, tool output, error run.
// Merges never cross block ids, so these are the merge units.
//
// A line's kind is known for sure only when the line is complete, so the tags
// of the tokens of the current line may still change; tags before
// stable_prefix() are final. Boundary marks the first token of each block and
// the tokens of a closing-brace line (the end of a block is otherwise only
// known after it).
//
// Cost: O(length of the token text) per Feed, plus one provisional
// classification of the partial line while the line is within its first 48
// characters (past them the kind is decided by the prefix), plus one final
// classification per completed line. ~2.5K instructions per token on an
// agent-like mix (bench: polykv-bench policies, "tagger"). Thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "policies/session_view.h"

namespace polykv::policies {

class StructureTagger {
 public:
  StructureTagger();
  StructureTagger(const StructureTagger&) = delete;
  StructureTagger& operator=(const StructureTagger&) = delete;

  // Feeds one token piece of a message with `role`. A change of role starts a
  // new message (as does EndMessage()). Returns the token's tag as known now.
  StructTag Feed(std::string_view text, Role role);

  // Ends the current message: its last line is classified and becomes final.
  void EndMessage();

  // [num_tokens fed] current tags.
  const std::vector<StructTag>& tags() const { return tags_; }
  // Tags of tokens [0, stable_prefix()) will not change any more.
  size_t stable_prefix() const { return stable_; }

 private:
  enum class Lang : uint8_t { kUnknown, kPython, kBrace };
  enum class ScopeKind : uint8_t { kFunction, kClass, kOther };
  enum class Context : uint8_t { kProse, kCode, kToolCall, kToolOutput, kError };
  struct Scope {
    ScopeKind kind;
    int open_depth;  // brace depth inside the scope (brace) / header indent (python)
    uint32_t header_id;
    uint32_t body_id;  // 0 until the first body line
  };
  // Everything a line can change. Classify() works on a copy for the
  // provisional tag of a partial line and commits the copy at end of line.
  struct State {
    Context ctx = Context::kProse;
    Context outer = Context::kProse;  // context to return to after a fence / markup
    bool output_has_code = false;
    bool in_error_run = false;
    Lang lang = Lang::kUnknown;
    std::vector<Scope> scopes;
    int brace_depth = 0;
    int paren_depth = 0;  // open '(' of a multi-line signature
    int sig_indent = 0;   // indent of that signature (python)
    uint32_t sig_id = 0;  // block of the signature being continued / decorated
    bool in_block_comment = false;
    char docstring_quote = 0;  // quote char while inside a Python docstring
    bool in_go_import = false;
    bool pending_signature = false;  // brace signature without its '{' yet
    bool last_was_decorator = false;
    // Block runs.
    uint32_t next_block = 1;
    BlockKind run_kind = BlockKind::kNone;
    uint32_t run_owner = 0;
    uint32_t run_id = 0;
    bool blank_since_run = false;
    uint32_t message = 0;  // message counter, owner of message-level runs
  };
  struct LineClass {
    BlockKind kind = BlockKind::kText;
    uint32_t block_id = 0;
    uint16_t depth = 0;
    bool new_block = false;  // the line starts a new block
    bool closing = false;    // closing-brace line
  };

  static LineClass Classify(State& st, std::string_view line);
  static LineClass ClassifyCode(State& st, std::string_view line);
  static uint32_t Run(State& st, BlockKind kind, uint32_t owner, bool* is_new);
  void FinishLine();
  void Retag(const LineClass& c, size_t from);
  void StartMessage(Role role);

  Role role_ = Role::kSystem;
  bool in_message_ = false;
  State state_;
  std::string line_;
  std::vector<uint32_t> line_tokens_;  // token indices of the current line
  std::vector<StructTag> tags_;
  size_t stable_ = 0;
};

}  // namespace polykv::policies
