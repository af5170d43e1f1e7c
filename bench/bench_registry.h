// polykv-bench subcommands register themselves here, so each room's benchmark
// lives in its own file (bench/<name>_bench.cc) and main stays small.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace polykv::bench {

// A benchmark gets its own arguments (argv[0] is the subcommand name) and
// returns a process exit code. With --json it prints exactly one JSON object
// on stdout; progress goes to stderr.
using BenchMain = std::function<int(int argc, char** argv)>;

struct BenchEntry {
  std::string help;
  BenchMain main;
};

std::map<std::string, BenchEntry>& Registry();

struct Register {
  Register(const std::string& name, const std::string& help, BenchMain fn) {
    Registry()[name] = BenchEntry{help, std::move(fn)};
  }
};

}  // namespace polykv::bench

// POLYKV_BENCH(rpc, "help text", [](int argc, char** argv) { ... });
#define POLYKV_BENCH(name, help, fn) \
  static ::polykv::bench::Register polykv_bench_register_##name(#name, help, fn)
