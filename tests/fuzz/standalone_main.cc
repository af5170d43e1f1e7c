// A main() for the fuzz targets in builds without libFuzzer (the default GCC
// build): runs each seed input, then a fixed number of seeded random
// mutations of them. No coverage feedback, so it is a smoke test of the
// target and the seeds, not a fuzzer; scripts/fuzz.sh runs the real one.
//
//   <target> [--runs=N] [--seed=S] [--max_len=L] PATH...
// PATH is a file or a folder of files (a corpus). With --runs=0 it only
// replays PATH, e.g. a crash input.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

Bytes ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Sorted, so that a seed names the same run on every machine.
std::vector<Bytes> LoadInputs(const std::vector<std::string>& paths) {
  std::vector<std::filesystem::path> files;
  for (const std::string& p : paths) {
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<Bytes> out;
  for (const auto& f : files) out.push_back(ReadFile(f));
  return out;
}

// One of libFuzzer's simpler mutations, chosen at random.
void MutateOnce(Bytes& b, const std::vector<Bytes>& corpus, std::mt19937_64& rng) {
  auto below = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  static constexpr uint8_t kInteresting[] = {0, 1, 2, 0x7f, 0x80, 0xfe, 0xff, 16, 32, 64};
  switch (rng() % 9) {
    case 0:  // flip a bit
      if (!b.empty()) b[below(b.size())] ^= uint8_t(1u << (rng() % 8));
      break;
    case 1:  // a random byte
      if (!b.empty()) b[below(b.size())] = uint8_t(rng());
      break;
    case 2:  // an interesting byte
      if (!b.empty()) b[below(b.size())] = kInteresting[below(std::size(kInteresting))];
      break;
    case 3: {  // insert random bytes
      const size_t at = below(b.size() + 1), n = 1 + below(8);
      for (size_t i = 0; i < n; ++i) b.insert(b.begin() + ptrdiff_t(at), uint8_t(rng()));
      break;
    }
    case 4: {  // erase a range
      if (b.empty()) break;
      const size_t at = below(b.size()), n = 1 + below(std::min<size_t>(16, b.size() - at));
      b.erase(b.begin() + ptrdiff_t(at), b.begin() + ptrdiff_t(at + n));
      break;
    }
    case 5: {  // duplicate a range
      if (b.empty()) break;
      const size_t at = below(b.size()), n = 1 + below(std::min<size_t>(32, b.size() - at));
      Bytes chunk(b.begin() + ptrdiff_t(at), b.begin() + ptrdiff_t(at + n));
      b.insert(b.begin() + ptrdiff_t(below(b.size() + 1)), chunk.begin(), chunk.end());
      break;
    }
    case 6: {  // splice in a piece of another input
      const Bytes& o = corpus[below(corpus.size())];
      if (o.empty()) break;
      const size_t at = below(o.size()), n = 1 + below(o.size() - at);
      b.insert(b.begin() + ptrdiff_t(below(b.size() + 1)), o.begin() + ptrdiff_t(at),
               o.begin() + ptrdiff_t(at + n));
      break;
    }
    case 7:  // truncate
      b.resize(below(b.size() + 1));
      break;
    case 8: {  // a random little-endian 8-byte integer (sizes, ids)
      if (b.size() < 8) break;
      uint64_t v = rng() % 2 ? rng() : uint64_t(1) << (rng() % 64);
      const size_t at = below(b.size() - 7);
      for (int i = 0; i < 8; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i));
      break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t runs = 20000, seed = 1;
  size_t max_len = 4096;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.rfind("--runs=", 0) == 0) {
      runs = std::strtoull(argv[i] + 7, nullptr, 10);
    } else if (a.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else if (a.rfind("--max_len=", 0) == 0) {
      max_len = std::strtoull(argv[i] + 10, nullptr, 10);
    } else {
      paths.emplace_back(a);
    }
  }
  std::vector<Bytes> corpus = LoadInputs(paths);
  if (corpus.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--runs=N] [--seed=S] [--max_len=L] PATH...\n"
                 "no inputs found\n",
                 argv[0]);
    return 2;
  }
  std::printf("%zu seed inputs, %llu mutations, seed %llu\n", corpus.size(),
              static_cast<unsigned long long>(runs), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  for (const Bytes& b : corpus) LLVMFuzzerTestOneInput(b.data(), b.size());
  std::mt19937_64 rng(seed);
  for (uint64_t r = 0; r < runs; ++r) {
    Bytes b = corpus[rng() % corpus.size()];
    const int n = 1 + int(rng() % 4);
    for (int i = 0; i < n; ++i) MutateOnce(b, corpus, rng);
    if (b.size() > max_len) b.resize(max_len);
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  std::printf("done: %llu executions, no crash\n",
              static_cast<unsigned long long>(corpus.size() + runs));
  return 0;
}
