// The incremental tagger on real code in each language and on an agent
// transcript, fed in tokenizer-like pieces.
#include "policies/tagger.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace polykv::policies {
namespace {

// Splits text the way BPE tokenizers roughly do: " word", runs of whitespace
// (newlines included), single punctuation characters.
std::vector<std::string> Pieces(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  while (i < text.size()) {
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && ident(text[j + 1])) {
      ++j;
      while (j < text.size() && ident(text[j])) ++j;
    } else if (ident(text[j])) {
      while (j < text.size() && ident(text[j])) ++j;
    } else if (std::isspace(static_cast<unsigned char>(text[j]))) {
      while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    } else {
      ++j;
    }
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

struct Line {
  std::string text;  // trimmed
  StructTag tag;     // tag of its first non-blank token
};

class Transcript {
 public:
  // Feeds one message piece by piece; checks that tags before the stable
  // prefix never change afterwards.
  void Message(Role role, const std::string& text) {
    for (const std::string& p : Pieces(text)) {
      tagger_.Feed(p, role);
      pieces_.push_back(p);
      Check();
    }
    tagger_.EndMessage();
    Check();
    EXPECT_EQ(tagger_.stable_prefix(), tagger_.tags().size());
  }

  // Lines of everything fed so far.
  std::vector<Line> Lines() const {
    std::vector<Line> lines;
    std::string cur;
    bool have = false;
    StructTag tag;
    for (size_t k = 0; k < pieces_.size(); ++k) {
      for (char c : pieces_[k]) {
        if (c == '\n') {
          if (have) lines.push_back({Trim(cur), tag});
          cur.clear();
          have = false;
        } else {
          cur += c;
          if (!have && !std::isspace(static_cast<unsigned char>(c))) {
            have = true;
            tag = tagger_.tags()[k];
          }
        }
      }
    }
    if (have) lines.push_back({Trim(cur), tag});
    return lines;
  }

  // The n-th line (0-based) starting with prefix.
  StructTag Tag(const std::string& prefix, int n = 0) const {
    for (const Line& l : Lines()) {
      if (l.text.rfind(prefix, 0) == 0 && n-- == 0) return l.tag;
    }
    ADD_FAILURE() << "no line starting with '" << prefix << "'";
    return {};
  }

 private:
  static std::string Trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }
  void Check() {
    const auto& tags = tagger_.tags();
    for (size_t i = 0; i < std::min(stable_.size(), tagger_.stable_prefix()); ++i) {
      ASSERT_EQ(tags[i].kind, stable_[i].kind) << "stable tag " << i << " changed";
      ASSERT_EQ(tags[i].block_id, stable_[i].block_id) << "stable tag " << i << " changed";
    }
    stable_.assign(tags.begin(), tags.begin() + tagger_.stable_prefix());
  }

  StructureTagger tagger_;
  std::vector<std::string> pieces_;
  std::vector<StructTag> stable_;
};

#define EXPECT_KIND(t, prefix, K) EXPECT_EQ((t).Tag(prefix).kind, BlockKind::K) << prefix

TEST(TaggerTest, Python) {
  Transcript t;
  t.Message(Role::kAssistant, R"(Here is the module:
```python
import os
from typing import List

# Helper utilities.
@dataclass
class Point:
    x: int
    y: int

    def norm(self) -> float:
        """Euclidean norm."""
        return (self.x ** 2 + self.y ** 2) ** 0.5

def parse(lines: List[str],
          strict: bool = False) -> List[Point]:
    out = []
    for line in lines:
        out.append(Point(*map(int, line.split())))
    return out

if __name__ == "__main__":
    print(parse(["1 2"]))
```
Done.
)");
  EXPECT_KIND(t, "Here is", kText);
  EXPECT_KIND(t, "import os", kImport);
  EXPECT_KIND(t, "from typing", kImport);
  EXPECT_EQ(t.Tag("import os").block_id, t.Tag("from typing").block_id);
  EXPECT_KIND(t, "# Helper", kComment);
  EXPECT_KIND(t, "@dataclass", kSignature);
  EXPECT_KIND(t, "class Point", kClass);
  EXPECT_KIND(t, "x: int", kClass);
  EXPECT_EQ(t.Tag("x: int").block_id, t.Tag("class Point").block_id);
  EXPECT_KIND(t, "def norm", kSignature);
  EXPECT_EQ(t.Tag("def norm").depth, 1);
  EXPECT_KIND(t, "\"\"\"Euclidean", kComment);
  EXPECT_KIND(t, "return (self.x", kBody);
  EXPECT_KIND(t, "def parse", kSignature);
  EXPECT_KIND(t, "strict: bool", kSignature);
  EXPECT_EQ(t.Tag("def parse").block_id, t.Tag("strict: bool").block_id);
  EXPECT_TRUE(t.Tag("def parse").boundary);
  EXPECT_KIND(t, "out = []", kBody);
  EXPECT_KIND(t, "out.append", kBody);
  EXPECT_KIND(t, "return out", kBody);
  EXPECT_EQ(t.Tag("out = []").block_id, t.Tag("return out").block_id);
  EXPECT_NE(t.Tag("out = []").block_id, t.Tag("return (self.x").block_id);
  EXPECT_KIND(t, "if __name__", kStatement);
  EXPECT_KIND(t, "Done.", kText);
}

TEST(TaggerTest, JavaScriptAndTypeScript) {
  Transcript t;
  t.Message(Role::kAssistant, R"(```ts
import { readFile } from "fs/promises";
const path = require("path");

// Loads the config.
export interface Config {
  name: string;
  retries: number;
}

export async function loadConfig(file: string): Promise<Config> {
  const text = await readFile(file, "utf8");
  return JSON.parse(text) as Config;
}

export class Client {
  constructor(private readonly cfg: Config) {}

  async fetch(url: string) {
    for (let i = 0; i < this.cfg.retries; i++) {
      console.log(url);
    }
  }
}

const double = (x: number) => x * 2;
```
)");
  EXPECT_KIND(t, "import {", kImport);
  EXPECT_KIND(t, "const path", kImport);
  EXPECT_KIND(t, "// Loads", kComment);
  EXPECT_KIND(t, "export interface", kClass);
  EXPECT_KIND(t, "name: string", kClass);
  EXPECT_KIND(t, "export async function", kSignature);
  EXPECT_KIND(t, "const text", kBody);
  EXPECT_KIND(t, "return JSON", kBody);
  EXPECT_KIND(t, "export class Client", kClass);
  EXPECT_KIND(t, "constructor(", kSignature);
  EXPECT_KIND(t, "async fetch", kSignature);
  EXPECT_EQ(t.Tag("async fetch").depth, 1);
  EXPECT_KIND(t, "for (let", kBody);
  EXPECT_KIND(t, "console.log", kBody);
  EXPECT_EQ(t.Tag("console.log").depth, 3);
  EXPECT_EQ(t.Tag("for (let").block_id, t.Tag("console.log").block_id);
  EXPECT_KIND(t, "const double", kSignature);
}

TEST(TaggerTest, PlainJavaScript) {
  Transcript t;
  t.Message(Role::kToolOutput, R"('use strict';
const express = require('express');

/* Routes. */
function makeApp(db) {
  const app = express();
  app.get('/items/:id', async (req, res) => {
    const item = await db.find(req.params.id);
    res.json(item);
  });
  return app;
}

class Cache {
  constructor(limit) {
    this.limit = limit;
  }
  get(key) {
    return this.map.get(key);
  }
}

module.exports = { makeApp, Cache };
)");
  EXPECT_KIND(t, "const express", kImport);
  EXPECT_KIND(t, "/* Routes", kComment);
  EXPECT_KIND(t, "function makeApp", kSignature);
  EXPECT_KIND(t, "const app", kBody);
  EXPECT_KIND(t, "app.get(", kBody);
  EXPECT_KIND(t, "res.json", kBody);
  EXPECT_KIND(t, "return app", kBody);
  EXPECT_EQ(t.Tag("const app").block_id, t.Tag("return app").block_id);
  EXPECT_KIND(t, "class Cache", kClass);
  EXPECT_KIND(t, "constructor(limit)", kSignature);
  EXPECT_KIND(t, "this.limit", kBody);
  EXPECT_KIND(t, "get(key)", kSignature);
  EXPECT_KIND(t, "return this.map", kBody);
  EXPECT_NE(t.Tag("this.limit").block_id, t.Tag("return this.map").block_id);
  EXPECT_KIND(t, "module.exports", kStatement);
}

TEST(TaggerTest, PythonFileInToolOutput) {
  Transcript t;
  t.Message(Role::kToolOutput, R"(#!/usr/bin/env python3
"""Command line entry point.

Parses arguments and runs the job.
"""
import argparse


def main(argv=None):
    parser = argparse.ArgumentParser()
    return parser.parse_args(argv)
)");
  EXPECT_KIND(t, "#!/usr/bin", kComment);
  EXPECT_KIND(t, "\"\"\"Command", kComment);
  EXPECT_KIND(t, "Parses arguments", kComment);
  EXPECT_KIND(t, "import argparse", kImport);
  EXPECT_KIND(t, "def main", kSignature);
  EXPECT_KIND(t, "parser =", kBody);
  EXPECT_KIND(t, "return parser", kBody);
}

TEST(TaggerTest, Java) {
  Transcript t;
  t.Message(Role::kToolOutput, R"(package com.example.store;

import java.util.List;
import java.util.Map;

/**
 * In-memory inventory.
 */
public class Inventory {
    private final Map<String, Integer> counts;

    @Override
    public String toString() {
        return counts.toString();
    }

    public int add(String sku,
                   int n) {
        if (n < 0) {
            throw new IllegalArgumentException("negative");
        }
        return counts.merge(sku, n, Integer::sum);
    }
}
)");
  EXPECT_KIND(t, "package", kImport);
  EXPECT_KIND(t, "import java.util.List", kImport);
  EXPECT_KIND(t, "/**", kComment);
  EXPECT_KIND(t, "* In-memory", kComment);
  EXPECT_KIND(t, "*/", kComment);
  EXPECT_KIND(t, "public class Inventory", kClass);
  EXPECT_KIND(t, "private final Map", kClass);
  EXPECT_KIND(t, "@Override", kSignature);
  EXPECT_KIND(t, "public String toString", kSignature);
  EXPECT_EQ(t.Tag("@Override").block_id, t.Tag("public String toString").block_id);
  EXPECT_KIND(t, "return counts.toString", kBody);
  EXPECT_KIND(t, "public int add", kSignature);
  EXPECT_KIND(t, "int n) {", kSignature);
  EXPECT_KIND(t, "if (n < 0)", kBody);
  EXPECT_KIND(t, "throw new", kBody);
  EXPECT_KIND(t, "return counts.merge", kBody);
  EXPECT_EQ(t.Tag("if (n < 0)").block_id, t.Tag("return counts.merge").block_id);
  EXPECT_TRUE(t.Tag("}", 1).boundary);  // closing line of add's if
}

TEST(TaggerTest, C) {
  Transcript t;
  t.Message(Role::kAssistant, R"(```c
#include <stdio.h>
#include "util.h"

#define MAX 16

/* Sums an array. */
static int sum(const int *xs, int n)
{
    int s = 0;
    for (int i = 0; i < n; i++) {
        s += xs[i];
    }
    return s;
}

struct point {
    int x, y;
};

int main(void) {
    printf("%d\n", sum((int[]){1, 2}, 2));
    return 0;
}
```
)");
  EXPECT_KIND(t, "#include <stdio.h>", kImport);
  EXPECT_KIND(t, "#include \"util.h\"", kImport);
  EXPECT_KIND(t, "#define", kStatement);
  EXPECT_KIND(t, "/* Sums", kComment);
  EXPECT_KIND(t, "static int sum", kSignature);
  EXPECT_KIND(t, "{", kSignature);
  EXPECT_KIND(t, "int s = 0", kBody);
  EXPECT_KIND(t, "s += xs", kBody);
  EXPECT_KIND(t, "return s", kBody);
  EXPECT_KIND(t, "struct point", kClass);
  EXPECT_KIND(t, "int x, y", kClass);
  EXPECT_KIND(t, "int main", kSignature);
  EXPECT_KIND(t, "printf", kBody);
  EXPECT_KIND(t, "return 0", kBody);
  EXPECT_NE(t.Tag("printf").block_id, t.Tag("return s").block_id);
}

TEST(TaggerTest, Cpp) {
  Transcript t;
  t.Message(Role::kAssistant, R"(```cpp
#include <vector>

namespace geo {

template <typename T>
class Grid {
 public:
  explicit Grid(int w) : w_(w) {}
  T& at(int x) { return cells_[x]; }

 private:
  int w_;
  std::vector<T> cells_;
};

std::vector<int> Sizes(const Grid<int>& g) {
  // One entry per row.
  return {g.at(0)};
}

}  // namespace geo
```
)");
  EXPECT_KIND(t, "#include <vector>", kImport);
  EXPECT_KIND(t, "namespace geo", kClass);
  EXPECT_KIND(t, "class Grid", kClass);
  EXPECT_KIND(t, "explicit Grid", kSignature);
  EXPECT_KIND(t, "T& at", kSignature);
  EXPECT_KIND(t, "int w_", kClass);
  EXPECT_EQ(t.Tag("int w_").block_id, t.Tag("class Grid").block_id);
  EXPECT_KIND(t, "std::vector<int> Sizes", kSignature);
  EXPECT_KIND(t, "// One entry", kComment);
  EXPECT_KIND(t, "return {g.at", kBody);
  EXPECT_EQ(t.Tag("return {g.at").depth, 2);
}

TEST(TaggerTest, Go) {
  Transcript t;
  t.Message(Role::kAssistant, R"(```go
package main

import (
	"fmt"
	"strings"
)

// Server handles requests.
type Server struct {
	name string
}

func (s *Server) Greet(who string) string {
	if who == "" {
		return "hello"
	}
	return fmt.Sprintf("hello %s", strings.ToUpper(who))
}

func main() {
	fmt.Println((&Server{}).Greet("go"))
}
```
)");
  EXPECT_KIND(t, "package main", kImport);
  EXPECT_KIND(t, "import (", kImport);
  EXPECT_KIND(t, "\"strings\"", kImport);
  EXPECT_KIND(t, ")", kImport);
  EXPECT_KIND(t, "// Server", kComment);
  EXPECT_KIND(t, "type Server struct", kClass);
  EXPECT_KIND(t, "name string", kClass);
  EXPECT_KIND(t, "func (s *Server)", kSignature);
  EXPECT_KIND(t, "if who", kBody);
  EXPECT_KIND(t, "return \"hello\"", kBody);
  EXPECT_KIND(t, "return fmt.Sprintf", kBody);
  EXPECT_KIND(t, "func main", kSignature);
  EXPECT_KIND(t, "fmt.Println", kBody);
}

TEST(TaggerTest, Rust) {
  Transcript t;
  t.Message(Role::kAssistant, R"(```rust
use std::collections::HashMap;
use std::fmt;

/// A word counter.
#[derive(Debug, Default)]
pub struct Counter {
    counts: HashMap<String, usize>,
}

impl Counter {
    pub fn add(&mut self, word: &str) {
        *self.counts.entry(word.to_string()).or_insert(0) += 1;
    }

    pub fn get(&self, word: &str) -> usize {
        self.counts.get(word).copied().unwrap_or(0)
    }
}

impl fmt::Display for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} words", self.counts.len())
    }
}
```
)");
  EXPECT_KIND(t, "use std::collections", kImport);
  EXPECT_KIND(t, "/// A word", kComment);
  EXPECT_KIND(t, "#[derive", kSignature);
  EXPECT_KIND(t, "pub struct Counter", kClass);
  EXPECT_KIND(t, "counts: HashMap", kClass);
  EXPECT_KIND(t, "impl Counter", kClass);
  EXPECT_KIND(t, "pub fn add", kSignature);
  EXPECT_KIND(t, "*self.counts", kBody);
  EXPECT_KIND(t, "pub fn get", kSignature);
  EXPECT_KIND(t, "self.counts.get", kBody);
  EXPECT_KIND(t, "impl fmt::Display", kClass);
  EXPECT_KIND(t, "fn fmt", kSignature);
  EXPECT_KIND(t, "write!", kBody);
  EXPECT_NE(t.Tag("*self.counts").block_id, t.Tag("self.counts.get").block_id);
}

TEST(TaggerTest, AgentTranscript) {
  Transcript t;
  t.Message(Role::kSystem, "You are a coding agent.\n");
  t.Message(Role::kUser, "Fix the failing test in utils.py.\n");
  t.Message(Role::kAssistant,
            "I'll look at the file first.\n<tool_call>\n"
            "{\"name\": \"read_file\", \"arguments\": {\"path\": \"utils.py\"}}\n</tool_call>\n");
  t.Message(Role::kToolOutput, "def add(a, b):\n    return a - b\n");
  t.Message(Role::kAssistant, "Running the tests.\n");
  t.Message(Role::kToolCall, "{\"name\": \"run\", \"arguments\": {\"cmd\": \"pytest\"}}\n");
  t.Message(Role::kToolOutput,
            "============ test session starts ============\n"
            "collected 1 item\n\n"
            "Traceback (most recent call last):\n"
            "  File \"test_utils.py\", line 3, in test_add\n"
            "    assert add(2, 2) == 4\n"
            "AssertionError\n\n"
            "1 failed in 0.02s\n");
  t.Message(Role::kError, "error: command exited with status 1\n");
  t.Message(Role::kAssistant,
            "The bug is in add:\n```python\ndef add(a, b):\n    return a + b\n```\n");

  EXPECT_KIND(t, "You are", kText);
  EXPECT_KIND(t, "Fix the", kText);
  EXPECT_NE(t.Tag("You are").block_id, t.Tag("Fix the").block_id);
  EXPECT_KIND(t, "I'll look", kText);
  EXPECT_KIND(t, "<tool_call>", kToolCall);
  EXPECT_KIND(t, "{\"name\": \"read_file\"", kToolCall);
  EXPECT_KIND(t, "</tool_call>", kToolCall);
  EXPECT_EQ(t.Tag("<tool_call>").block_id, t.Tag("</tool_call>").block_id);
  EXPECT_NE(t.Tag("<tool_call>").block_id, t.Tag("I'll look").block_id);
  EXPECT_KIND(t, "def add(a, b):", kSignature);
  EXPECT_KIND(t, "return a - b", kBody);
  EXPECT_KIND(t, "{\"name\": \"run\"", kToolCall);
  EXPECT_KIND(t, "=====", kToolOutput);
  EXPECT_KIND(t, "collected", kToolOutput);
  EXPECT_KIND(t, "Traceback", kError);
  EXPECT_KIND(t, "File \"test_utils.py\"", kError);
  EXPECT_KIND(t, "assert add", kError);
  EXPECT_KIND(t, "AssertionError", kError);
  EXPECT_EQ(t.Tag("Traceback").block_id, t.Tag("AssertionError").block_id);
  EXPECT_NE(t.Tag("Traceback").block_id, t.Tag("collected").block_id);
  EXPECT_KIND(t, "1 failed", kToolOutput);
  EXPECT_KIND(t, "error: command", kError);
  EXPECT_KIND(t, "The bug", kText);
  EXPECT_KIND(t, "def add(a, b):", kSignature);
  EXPECT_EQ(t.Tag("def add(a, b):", 1).kind, BlockKind::kSignature);
  EXPECT_EQ(t.Tag("return a + b").kind, BlockKind::kBody);
}

TEST(TaggerTest, TagsAreIndependentOfTokenBoundaries) {
  const std::string code = "```python\ndef f(x):\n    return x\n```\n";
  StructureTagger whole, chars;
  whole.Feed(code, Role::kAssistant);
  whole.EndMessage();
  for (char c : code) chars.Feed(std::string(1, c), Role::kAssistant);
  chars.EndMessage();
  // Per-character tags: the 'd' of def and the 'r' of return.
  const size_t def = code.find("def"), ret = code.find("return");
  EXPECT_EQ(chars.tags()[def].kind, BlockKind::kSignature);
  EXPECT_EQ(chars.tags()[ret].kind, BlockKind::kBody);
  EXPECT_EQ(chars.tags()[def + 1].block_id, chars.tags()[def].block_id);
  ASSERT_EQ(whole.tags().size(), 1u);
}

// Random text (printable, braces, quotes, markup, newlines) in random pieces
// and roles: no crash, one tag per token, stable tags never change.
TEST(TaggerTest, RandomInputIsSafe) {
  const uint64_t seed = 99;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  uint64_t s = seed;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  };
  // clang-format off
  const char* atoms[] = {"{", "}", "(", ")", "\"", "'", "\n", "    ", "def ", "class ", "fn ",
                         "func ", "#include", "//", "/*", "*/", "\"\"\"", "```", "```py\n",
                         "<tool_call>", "</tool_call>", "<tool_output>", "Traceback", "error:",
                         "x", "=", ";", ":", "@", "#[", "import ", "\t", "\xc3\xa9", "\0"};
  // clang-format on
  Transcript t;
  for (int m = 0; m < 40; ++m) {
    std::string text;
    const int n = 1 + static_cast<int>(next() % 200);
    for (int i = 0; i < n; ++i) text += atoms[next() % (sizeof(atoms) / sizeof(atoms[0]))];
    t.Message(static_cast<Role>(next() % kNumRoles), text);
  }
  EXPECT_FALSE(t.Lines().empty());
}

}  // namespace
}  // namespace polykv::policies
