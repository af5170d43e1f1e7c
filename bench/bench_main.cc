// polykv-bench: one binary, one subcommand per benchmark (see bench_registry.h).
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_registry.h"
#include "client/worker/blas_core.h"

namespace polykv::bench {
std::map<std::string, BenchEntry>& Registry() {
  static std::map<std::string, BenchEntry> registry;
  return registry;
}
}  // namespace polykv::bench

static void Usage(FILE* out) {
  std::fprintf(out, "usage: polykv-bench <benchmark> [--json] [options]\n\nbenchmarks:\n");
  for (const auto& [name, entry] : polykv::bench::Registry()) {
    std::fprintf(out, "  %-10s %s\n", name.c_str(), entry.help.c_str());
  }
  std::fprintf(out, "\n'polykv-bench <benchmark> --help' lists a benchmark's options.\n");
}

int main(int argc, char** argv) {
  polykv::worker::UseFastBlasKernels(argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  auto& registry = polykv::bench::Registry();
  auto it = registry.find(argv[1]);
  if (it == registry.end()) {
    std::fprintf(stderr, "polykv-bench: unknown benchmark '%s'\n\n", argv[1]);
    Usage(stderr);
    return 2;
  }
  return it->second.main(argc - 1, argv + 1);
}
