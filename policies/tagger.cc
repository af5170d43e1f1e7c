#include "policies/tagger.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace polykv::policies {
namespace {

// Characters of a partial line after which its provisional kind is kept.
constexpr size_t kProvisionalPrefix = 48;

bool IsIdent(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$'; }

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
}

std::string_view Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && IsSpace(s[b])) ++b;
  while (e > b && IsSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

int Indent(std::string_view s) {
  int n = 0;
  for (char c : s) {
    if (c == ' ') {
      n += 1;
    } else if (c == '\t') {
      n += 4;
    } else {
      break;
    }
  }
  return n;
}

bool Starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// s starts with the word w (followed by a non-identifier character or end).
bool Word(std::string_view s, std::string_view w) {
  return Starts(s, w) && (s.size() == w.size() || !IsIdent(s[w.size()]));
}

bool Contains(std::string_view s, std::string_view p) { return s.find(p) != s.npos; }

// Drops leading modifiers (visibility, storage, async...) of a declaration.
std::string_view StripModifiers(std::string_view s) {
  static constexpr std::array<std::string_view, 23> kMods = {
      "public",   "private",  "protected", "static",       "final",  "abstract",
      "export",   "default",  "pub",       "async",        "unsafe", "inline",
      "virtual",  "override", "sealed",    "synchronized", "native", "constexpr",
      "explicit", "declare",  "readonly",  "extern",       "const"};
  while (!s.empty() && IsIdent(s[0])) {
    size_t n = 0;
    while (n < s.size() && IsIdent(s[n])) ++n;
    const std::string_view w = s.substr(0, n);
    if (std::find(kMods.begin(), kMods.end(), w) == kMods.end()) break;
    std::string_view rest = Trim(s.substr(n));
    if (w == "pub" && n < s.size() && s[n] == '(') {  // pub(crate), pub(super)
      const size_t close = s.find(')', n);
      if (close == std::string_view::npos) break;
      rest = Trim(s.substr(close + 1));
    }
    // `const` is a modifier only before fn (Rust const fn); `const x =` is JS.
    if (w == "const" && !Word(rest, "fn")) break;
    if (w == "extern" && Starts(rest, "\"C\"")) rest = Trim(rest.substr(3));
    s = rest;
  }
  return s;
}

bool IsControl(std::string_view w) {
  static constexpr std::array<std::string_view, 20> kControl = {
      "if",    "for",  "while",  "switch", "catch", "return", "else",  "do",   "try",  "new",
      "throw", "case", "sizeof", "delete", "await", "yield",  "match", "elif", "with", "loop"};
  return std::find(kControl.begin(), kControl.end(), w) != kControl.end();
}

// in_code: the output is source code, where "Exception" or "error: " are
// ordinary identifiers and strings; only line-leading markers count there.
bool IsErrorLine(std::string_view t, bool in_code) {
  static constexpr std::array<std::string_view, 9> kStarts = {"Traceback (most recent call last)",
                                                              "error:",
                                                              "error[",
                                                              "Error:",
                                                              "ERROR",
                                                              "panic:",
                                                              "FAILED",
                                                              "FAIL",
                                                              "fatal:"};
  for (std::string_view p : kStarts) {
    if (Starts(t, p)) return true;
  }
  if (in_code) return false;
  static constexpr std::array<std::string_view, 10> kAnywhere = {
      ": error:",           "Exception", "Error: ",  "error: ",   "undefined reference",
      "Segmentation fault", "make: ***", "npm ERR!", "Assertion", "--- FAIL"};
  for (std::string_view p : kAnywhere) {
    if (Contains(t, p)) return true;
  }
  return false;
}

// Lines that are code in any of the languages with little doubt; used to
// notice code inside tool outputs.
bool StrongCode(std::string_view t) {
  std::string_view s = StripModifiers(t);
  return Word(t, "def") || Word(t, "import") || Starts(t, "#include") || Word(t, "package") ||
         Word(s, "class") || Word(s, "fn") || Word(t, "func") || Word(s, "function") ||
         Word(t, "use") || Word(s, "struct") || Word(s, "interface") || Word(s, "impl") ||
         (Word(t, "from") && Contains(t, " import ")) || Starts(t, "#!") || Starts(t, "//") ||
         Starts(t, "/*") || Starts(t, "\"\"\"") || Starts(t, "'use strict'") ||
         Starts(t, "\"use strict\"") || Contains(t, "require(") || Starts(t, "#pragma") ||
         Starts(t, "#define");
}

// Counts braces and parens outside "strings" and // comments.
void CountBrackets(std::string_view line, bool python, int* braces, int* parens, bool* opened) {
  bool in_str = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_str) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_str = false;
      }
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (!python && c == '/' && i + 1 < line.size() && line[i + 1] == '/') {
      break;
    } else if (python && c == '#') {
      break;
    } else if (c == '(') {
      ++*parens;
    } else if (c == ')') {
      --*parens;
    } else if (!python && c == '{') {
      ++*braces;
      *opened = true;
    } else if (!python && c == '}') {
      --*braces;
    }
  }
}

}  // namespace

StructureTagger::StructureTagger() = default;

uint32_t StructureTagger::Run(State& st, BlockKind kind, uint32_t owner, bool* is_new) {
  const bool paragraph_break = kind == BlockKind::kText && st.blank_since_run;
  if (kind == st.run_kind && owner == st.run_owner && st.run_id != 0 && !paragraph_break) {
    *is_new = false;
  } else {
    *is_new = true;
    st.run_kind = kind;
    st.run_owner = owner;
    st.run_id = st.next_block++;
  }
  st.blank_since_run = false;
  return st.run_id;
}

StructureTagger::LineClass StructureTagger::ClassifyCode(State& st, std::string_view line) {
  LineClass c;
  const std::string_view t = Trim(line);
  const int indent = Indent(line);
  auto depth = [&] {
    int fc = 0;
    for (const Scope& s : st.scopes) fc += s.kind != ScopeKind::kOther;
    return static_cast<uint16_t>(st.lang == Lang::kPython ? fc : std::max(0, st.brace_depth));
  };
  auto set = [&](BlockKind kind, uint32_t owner) {
    c.kind = kind;
    c.block_id = Run(st, kind, owner, &c.new_block);
    c.depth = depth();
    return c;
  };
  // Keep the block as it is on a given id (function body, class members).
  auto on = [&](BlockKind kind, uint32_t id) {
    c.kind = kind;
    c.new_block = !(st.run_kind == kind && st.run_id == id);
    st.run_kind = kind;
    st.run_owner = id;
    st.run_id = id;
    c.block_id = id;
    c.depth = depth();
    return c;
  };
  auto innermost = [&]() -> Scope* {
    for (auto it = st.scopes.rbegin(); it != st.scopes.rend(); ++it) {
      if (it->kind != ScopeKind::kOther) return &*it;
    }
    return nullptr;
  };
  if (t.empty()) {
    c.kind = st.run_kind == BlockKind::kNone ? BlockKind::kStatement : st.run_kind;
    c.block_id = st.run_id;
    c.depth = depth();
    return c;
  }
  // Comments that span lines.
  if (st.docstring_quote != 0) {
    const std::string_view q = st.docstring_quote == '"' ? "\"\"\"" : "'''";
    if (Contains(t, q)) st.docstring_quote = 0;
    return set(BlockKind::kComment, 0);
  }
  if (st.in_block_comment) {
    if (Contains(t, "*/")) st.in_block_comment = false;
    return set(BlockKind::kComment, 0);
  }
  // Language guess.
  if (st.lang == Lang::kUnknown) {
    if (t.back() == ':' && (Word(t, "def") || Word(t, "class") || Word(t, "if") || Word(t, "for") ||
                            Word(t, "async") || Word(t, "with"))) {
      st.lang = Lang::kPython;
    } else if (Contains(t, "{") || Contains(t, "};") || t.back() == ';') {
      st.lang = Lang::kBrace;
    }
  }
  const bool python = st.lang == Lang::kPython;
  // Python scopes end on dedent.
  if (python) {
    while (!st.scopes.empty() && indent <= st.scopes.back().open_depth && st.paren_depth == 0) {
      st.scopes.pop_back();
    }
  }
  int braces = 0, parens = 0;
  bool opened = false;
  CountBrackets(t, python, &braces, &parens, &opened);
  const int depth_before = st.brace_depth;
  auto apply_braces = [&] {
    st.brace_depth = std::max(0, st.brace_depth + braces);
    while (!st.scopes.empty() && st.lang != Lang::kPython &&
           st.scopes.back().open_depth > st.brace_depth) {
      st.scopes.pop_back();
    }
  };
  auto open_function = [&](uint32_t header) {
    if (python) {
      st.scopes.push_back({ScopeKind::kFunction, st.sig_indent, header, 0});
    } else if (opened && braces > 0) {
      st.scopes.push_back({ScopeKind::kFunction, depth_before + braces, header, 0});
    } else if (t.back() != ';') {
      st.pending_signature = true;
    }
  };
  // A multi-line parameter list continues the signature.
  if (st.paren_depth > 0) {
    st.paren_depth = std::max(0, st.paren_depth + parens);
    c = on(BlockKind::kSignature, st.sig_id);
    if (st.paren_depth == 0) open_function(st.sig_id);
    apply_braces();
    return c;
  }
  // Comments.
  const bool hash_comment =
      t[0] == '#' && !Starts(t, "#include") && !Starts(t, "#import") && !Starts(t, "#[") &&
      !Starts(t, "#![") &&
      (python || st.lang == Lang::kUnknown || Starts(t, "#!") || Starts(t, "# "));
  if (Starts(t, "//") || hash_comment) return set(BlockKind::kComment, 0);
  if (Starts(t, "/*")) {
    if (!Contains(t.substr(2), "*/")) st.in_block_comment = true;
    return set(BlockKind::kComment, 0);
  }
  if (Starts(t, "\"\"\"") || Starts(t, "'''")) {
    const std::string_view q = t.substr(0, 3);
    if (t.size() < 6 || !Contains(t.substr(3), q)) st.docstring_quote = t[0];
    return set(BlockKind::kComment, 0);
  }
  // Imports and preprocessor.
  const std::string_view stripped = StripModifiers(t);
  if (st.in_go_import) {
    if (t == ")") st.in_go_import = false;
    return set(BlockKind::kImport, 0);
  }
  if (Starts(t, "#include") || Starts(t, "#import") || Word(t, "import") || Word(t, "package") ||
      (Word(t, "from") && Contains(t, " import ")) || Word(t, "use") ||
      (Word(t, "using") && t.back() == ';') || Word(t, "extern crate") ||
      (Word(t, "mod") && t.back() == ';') || Word(stripped, "use") ||
      ((Word(t, "const") || Word(t, "var") || Word(t, "let")) && Contains(t, "require("))) {
    if (Starts(t, "import (")) st.in_go_import = true;
    return set(BlockKind::kImport, 0);
  }
  if (t[0] == '#' && !Starts(t, "#[") && !Starts(t, "#![")) {
    apply_braces();
    return set(BlockKind::kStatement, 0);  // other preprocessor lines
  }
  // Decorators, annotations, Rust attributes: the start of a signature block.
  if (t[0] == '@' || Starts(t, "#[") || Starts(t, "#![")) {
    if (st.last_was_decorator) {
      c = on(BlockKind::kSignature, st.sig_id);
    } else {
      c = set(BlockKind::kSignature, ~0u);
      st.run_owner = c.block_id;
      st.sig_id = c.block_id;
    }
    st.last_was_decorator = true;
    return c;
  }
  const bool decorated = st.last_was_decorator;
  st.last_was_decorator = false;
  // A brace signature whose '{' comes on the next line.
  if (st.pending_signature && t[0] == '{') {
    st.pending_signature = false;
    c = on(BlockKind::kSignature, st.sig_id);
    st.scopes.push_back({ScopeKind::kFunction, depth_before + braces, st.sig_id, 0});
    st.brace_depth = std::max(0, st.brace_depth + braces);
    return c;
  }
  st.pending_signature = false;
  // Closing lines belong to the block they close.
  if (t[0] == '}' && !python) {
    apply_braces();
    c.kind = st.run_kind == BlockKind::kNone ? BlockKind::kStatement : st.run_kind;
    c.block_id = st.run_id;
    c.depth = depth();
    c.closing = true;
    return c;
  }
  const std::string_view s = stripped;
  Scope* scope = innermost();
  const bool in_function = scope != nullptr && scope->kind == ScopeKind::kFunction;
  // Class-like declarations.
  const bool go_type = Word(t, "type") && (Contains(t, " struct") || Contains(t, " interface"));
  if (!in_function &&
      (Word(s, "class") || Word(s, "struct") || Word(s, "interface") || Word(s, "enum") ||
       Word(s, "trait") || Word(s, "impl") || Word(s, "namespace") || Word(s, "union") ||
       Word(s, "record") || go_type) &&
      !(t.back() == ';' && !opened)) {
    c = set(BlockKind::kClass, ~0u);
    st.run_owner = c.block_id;
    if (python) {
      st.scopes.push_back({ScopeKind::kClass, indent, c.block_id, 0});
    } else if (opened && braces > 0) {
      st.scopes.push_back({ScopeKind::kClass, depth_before + braces, c.block_id, 0});
    }
    if (!python) st.brace_depth = std::max(0, st.brace_depth + braces);
    return c;
  }
  // Signatures.
  bool sig = Word(s, "def") || Word(s, "function") || Starts(s, "function*") || Word(s, "fn") ||
             Word(t, "func");
  if (!sig && (Word(s, "const") || Word(s, "let") || Word(s, "var")) && Contains(t, "=>")) {
    const size_t eq = t.find('=');
    sig = eq != t.npos && (Contains(t.substr(eq), "(") || Contains(t.substr(eq), "async"));
  }
  if (!sig && !python && !in_function) {
    // C, C++, Java, C#, TS methods: `type name(args) {`, `Foo::bar(...)`,
    // `name(args) {` inside a class.
    const size_t paren = s.find('(');
    if (paren != s.npos && paren > 0 && (IsIdent(s[0]) || s[0] == '~' || s[0] == '*')) {
      const std::string_view head = Trim(s.substr(0, paren));
      size_t words = 0;
      bool word = false;
      for (char ch : head) {
        if (IsIdent(ch) || ch == '<' || ch == '>' || ch == ':' || ch == '*' || ch == '&' ||
            ch == '~' || ch == ',' || ch == '[' || ch == ']' || ch == '.') {
          if (!word) ++words;
          word = ch != ',';
          if (ch == '*' || ch == '&') word = false;
        } else {
          word = false;
        }
      }
      size_t first_end = 0;
      while (first_end < head.size() && IsIdent(head[first_end])) ++first_end;
      const bool no_assign = !Contains(head, "=");
      const bool method_ctx = scope != nullptr && scope->kind == ScopeKind::kClass;
      sig = no_assign && !IsControl(head.substr(0, first_end)) &&
            (words >= 2 || Contains(head, "::") || (method_ctx && words >= 1)) &&
            (t.back() != ';' || method_ctx) && !Contains(head, ".");
    }
  }
  if (sig) {
    if (decorated) {
      c = on(BlockKind::kSignature, st.sig_id);
    } else {
      c = set(BlockKind::kSignature, ~0u);
      st.run_owner = c.block_id;
      st.sig_id = c.block_id;
    }
    st.sig_indent = indent;
    st.paren_depth = std::max(0, parens);
    if (st.paren_depth == 0) open_function(st.sig_id);
    // open_function pushed the scope at depth_before + braces.
    if (!python) st.brace_depth = std::max(0, st.brace_depth + braces);
    return c;
  }
  // Everything else: body, class member, or module-level statement.
  if (scope != nullptr && scope->kind == ScopeKind::kFunction) {
    if (scope->body_id == 0) scope->body_id = st.next_block++;
    c = on(BlockKind::kBody, scope->body_id);
  } else if (scope != nullptr && scope->kind == ScopeKind::kClass) {
    c = on(BlockKind::kClass, scope->header_id);
  } else {
    c = set(BlockKind::kStatement, 0);
  }
  if (!python) {
    if (opened && braces > 0) {
      st.scopes.push_back({ScopeKind::kOther, depth_before + braces, 0, 0});
    }
    apply_braces();
  }
  return c;
}

StructureTagger::LineClass StructureTagger::Classify(State& st, std::string_view line) {
  LineClass c;
  const std::string_view t = Trim(line);
  auto set = [&](BlockKind kind, uint32_t owner) {
    c.kind = kind;
    c.block_id = Run(st, kind, owner, &c.new_block);
    return c;
  };
  // Agent markup, in any message.
  if (Contains(t, "<tool_call>") || Contains(t, "<function_call>")) {
    if (st.ctx != Context::kToolCall) st.outer = st.ctx;
    st.ctx = Context::kToolCall;
    st.run_id = 0;  // a new call is a new block
    set(BlockKind::kToolCall, st.message);
    if (Contains(t, "</tool_call>") || Contains(t, "</function_call>")) st.ctx = st.outer;
    return c;
  }
  if (Contains(t, "<tool_output>") || Contains(t, "<tool_response>") ||
      Contains(t, "<tool_result>")) {
    if (st.ctx != Context::kToolOutput) st.outer = st.ctx;
    st.ctx = Context::kToolOutput;
    st.output_has_code = false;
    st.in_error_run = false;
    st.run_id = 0;
    return set(BlockKind::kToolOutput, st.message);
  }
  if (Contains(t, "</tool_call>") || Contains(t, "</function_call>")) {
    set(BlockKind::kToolCall, st.message);
    st.ctx = st.outer;
    return c;
  }
  if (Contains(t, "</tool_output>") || Contains(t, "</tool_response>") ||
      Contains(t, "</tool_result>")) {
    set(st.in_error_run ? BlockKind::kError : BlockKind::kToolOutput, st.message);
    st.ctx = st.outer;
    st.in_error_run = false;
    return c;
  }
  switch (st.ctx) {
    case Context::kToolCall:
      return set(BlockKind::kToolCall, st.message);
    case Context::kError:
      return set(BlockKind::kError, st.message);
    case Context::kProse:
    case Context::kCode: {
      if (Starts(t, "```")) {
        set(BlockKind::kText, st.message);
        if (st.ctx == Context::kCode) {
          st.ctx = Context::kProse;
        } else {
          st.ctx = Context::kCode;
          const std::string_view info = Trim(t.substr(3));
          st.scopes.clear();
          st.brace_depth = st.paren_depth = 0;
          st.in_block_comment = st.in_go_import = st.pending_signature = false;
          st.last_was_decorator = false;
          st.docstring_quote = 0;
          if (info == "python" || info == "py") {
            st.lang = Lang::kPython;
          } else if (info.empty()) {
            st.lang = Lang::kUnknown;
          } else {
            st.lang = Lang::kBrace;
          }
          st.run_kind = BlockKind::kNone;  // code starts a new block
        }
        return c;
      }
      if (st.ctx == Context::kCode) return ClassifyCode(st, line);
      if (t.empty()) {
        st.blank_since_run = true;
        c.kind = BlockKind::kText;
        c.block_id = st.run_id;
        return c;
      }
      return set(BlockKind::kText, st.message);
    }
    case Context::kToolOutput: {
      if (t.empty()) {
        st.in_error_run = false;
        c.kind = st.run_kind;
        c.block_id = st.run_id;
        return c;
      }
      if (IsErrorLine(t, st.output_has_code) || st.in_error_run) {
        st.in_error_run = true;
        return set(BlockKind::kError, st.message);
      }
      if (st.output_has_code || StrongCode(t)) {
        st.output_has_code = true;
        return ClassifyCode(st, line);
      }
      return set(BlockKind::kToolOutput, st.message);
    }
  }
  return c;
}

void StructureTagger::StartMessage(Role role) {
  if (!line_.empty() || !line_tokens_.empty()) FinishLine();
  role_ = role;
  in_message_ = true;
  State& st = state_;
  ++st.message;
  st.scopes.clear();
  st.brace_depth = st.paren_depth = 0;
  st.in_block_comment = st.in_go_import = st.pending_signature = st.last_was_decorator = false;
  st.docstring_quote = 0;
  st.lang = Lang::kUnknown;
  st.output_has_code = st.in_error_run = false;
  st.run_kind = BlockKind::kNone;
  st.run_id = 0;
  switch (role) {
    case Role::kToolCall:
      st.ctx = Context::kToolCall;
      break;
    case Role::kToolOutput:
      st.ctx = Context::kToolOutput;
      break;
    case Role::kError:
      st.ctx = Context::kError;
      break;
    default:
      st.ctx = Context::kProse;
      break;
  }
  st.outer = st.ctx;
}

void StructureTagger::EndMessage() {
  if (!line_.empty() || !line_tokens_.empty()) FinishLine();
  in_message_ = false;
}

void StructureTagger::Retag(const LineClass& c, size_t from) {
  bool first = c.new_block;
  for (size_t k = from; k < line_tokens_.size(); ++k) {
    StructTag& tag = tags_[line_tokens_[k]];
    tag.kind = c.kind;
    tag.block_id = c.block_id;
    tag.depth = c.depth;
    tag.boundary = c.closing || (first && k == 0);
  }
}

void StructureTagger::FinishLine() {
  const LineClass c = Classify(state_, line_);
  Retag(c, 0);
  line_.clear();
  line_tokens_.clear();
  stable_ = tags_.size();
}

StructTag StructureTagger::Feed(std::string_view text, Role role) {
  if (!in_message_ || role != role_) StartMessage(role);
  const uint32_t index = static_cast<uint32_t>(tags_.size());
  tags_.push_back(StructTag{});
  const size_t last_nl = text.rfind('\n');
  if (last_nl == text.npos) {
    line_tokens_.push_back(index);
    line_.append(text);
  } else {
    const std::string_view tail = text.substr(last_nl + 1);
    const bool belongs_after = !Trim(tail).empty();
    if (!belongs_after) line_tokens_.push_back(index);
    size_t start = 0;
    for (size_t nl = text.find('\n'); nl != text.npos; nl = text.find('\n', start)) {
      line_.append(text.substr(start, nl - start));
      FinishLine();
      start = nl + 1;
    }
    if (belongs_after) {
      stable_ = index;  // this token's line is not complete
      line_tokens_.push_back(index);
    }
    line_.append(tail);
  }
  if (!line_tokens_.empty() && line_tokens_.back() == index) {
    if (line_tokens_.size() > 1 && line_.size() > kProvisionalPrefix) {
      // Past the prefix that decides a line's kind, the provisional tag
      // cannot change any more; the end of the line settles it.
      StructTag tag = tags_[line_tokens_[line_tokens_.size() - 2]];
      tag.boundary = false;
      tags_[index] = tag;
    } else {
      // Provisional tag of the partial line, from a copy of the state.
      State copy = state_;
      const LineClass c = Classify(copy, line_);
      Retag(c, 0);
    }
  }
  return tags_[index];
}

}  // namespace polykv::policies
