// polykv-bench weights: dequantization throughput (Gelem/s) per GGML type on
// the real tensors of the Qwen2.5-Coder files, the scalar reference
// (Dequantize) against each vector ISA's kernel (weights/dequant.h), in the
// shape prefill uses them: tiles of 64 rows into one reused f32 buffer, one
// thread. Kinds run interleaved, round after round, in one process; each
// figure is the best round.
//
//   polykv-bench weights [--json] [--model NAME_OR_PATH]... [--rounds 3]
//                        [--max-elements-per-type 67108864]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "client/worker/conversation.h"
#include "client/worker/clock.h"
#include "client/worker/gguf.h"
#include "client/worker/weights/dequant.h"
#include "client/worker/weights/ggml_types.h"

namespace polykv::bench {
namespace {

using worker::Isa;

constexpr int kTileRows = 64;  // As WeightMatrix::MatMul's prefill tiles.

struct Options {
  bool json = false;
  std::vector<std::string> models;
  int rounds = 3;
  int64_t max_elements = int64_t{64} << 20;
};

// The tensors of one type, up to the element budget: (data, rows, cols).
struct Slice {
  const uint8_t* data;
  int64_t rows, cols;
};

struct TypeRow {
  std::string model;
  uint32_t type = 0;
  int64_t elements = 0;
  std::vector<Slice> slices;
  std::map<std::string, double> best_s;  // kind -> fastest round, seconds.
};

// One pass over the type's slices with `isa` (kScalar: the reference).
// Returns a checksum so the work cannot be dropped.
double Pass(const TypeRow& row, Isa isa, std::vector<float>& tile) {
  int be = 0, bb = 0;
  worker::GgmlBlockInfo(row.type, &be, &bb);
  double sum = 0;
  for (const Slice& s : row.slices) {
    const size_t row_bytes = static_cast<size_t>(s.cols / be) * bb;
    tile.resize(static_cast<size_t>(kTileRows) * s.cols);
    for (int64_t r = 0; r < s.rows; r += kTileRows) {
      const int64_t count = std::min<int64_t>(kTileRows, s.rows - r);
      const uint8_t* src = s.data + r * row_bytes;
      const absl::Status st =
          isa == Isa::kScalar
              ? worker::Dequantize(row.type, src, count * s.cols, tile.data())
              : worker::DequantizeWith(isa, row.type, src, count * s.cols, tile.data());
      if (!st.ok()) std::abort();  // Types and sizes were checked when collected.
      sum += tile[0];
    }
  }
  return sum;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "weights bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") o.json = true;
    else if (a == "--model") o.models.push_back(value());
    else if (a == "--rounds") o.rounds = std::atoi(value());
    else if (a == "--max-elements-per-type") o.max_elements = std::atoll(value());
    else if (a == "--help" || a == "-h") {
      std::printf("polykv-bench weights [--json] [--model NAME_OR_PATH]... [--rounds N] "
                  "[--max-elements-per-type N]\n");
      return 0;
    } else {
      std::fprintf(stderr, "weights bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.rounds <= 0 || o.max_elements <= 0) {
    std::fprintf(stderr, "weights bench: --rounds and --max-elements-per-type must be positive\n");
    return 2;
  }
  if (o.models.empty()) o.models = {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"};

  std::vector<Isa> kinds = {Isa::kScalar};
  if (worker::BestIsa() >= Isa::kAvx2) kinds.push_back(Isa::kAvx2);
  if (worker::BestIsa() >= Isa::kAvx512) kinds.push_back(Isa::kAvx512);
  auto kind_name = [](Isa isa) {
    return isa == Isa::kScalar ? std::string("reference") : std::string(worker::IsaName(isa));
  };

  std::vector<std::unique_ptr<worker::GgufFile>> files;
  std::vector<TypeRow> rows;
  for (const std::string& name : o.models) {
    auto path = worker::ModelPath(name);
    auto file = path.ok() ? worker::GgufFile::Open(*path)
                          : absl::StatusOr<std::unique_ptr<worker::GgufFile>>(path.status());
    if (!file.ok()) {
      std::fprintf(stderr, "weights bench: %s: %s (run scripts/fetch-model.sh %s)\n",
                   name.c_str(), std::string(file.status().message()).c_str(), name.c_str());
      return 1;
    }
    std::map<uint32_t, TypeRow> by_type;
    for (const auto& [tname, t] : (*file)->tensors()) {
      int be = 0, bb = 0;
      if (t.dims.size() != 2 || !worker::GgmlBlockInfo(t.type, &be, &bb) ||
          t.dims[0] % be != 0 || t.type == 0 /* f32: a memcpy */) {
        continue;
      }
      TypeRow& row = by_type[t.type];
      row.model = name;
      row.type = t.type;
      const int64_t left = o.max_elements - row.elements;
      if (left < t.dims[0]) continue;
      const int64_t take = std::min<int64_t>(t.dims[1], left / t.dims[0]);
      row.slices.push_back(Slice{t.data, take, t.dims[0]});
      row.elements += take * t.dims[0];
    }
    for (auto& [type, row] : by_type) {
      if (row.elements > 0) rows.push_back(std::move(row));
    }
    files.push_back(std::move(*file));
  }

  std::vector<float> tile;
  double checksum = 0;
  for (int round = 0; round < o.rounds; ++round) {
    for (TypeRow& row : rows) {
      for (Isa isa : kinds) {
        const double t0 = worker::SteadySeconds();
        checksum += Pass(row, isa, tile);
        const double s = worker::SteadySeconds() - t0;
        auto [it, fresh] = row.best_s.emplace(kind_name(isa), s);
        if (!fresh) it->second = std::min(it->second, s);
      }
    }
    std::fprintf(stderr, "weights bench: round %d/%d done\n", round + 1, o.rounds);
  }

  auto gelem = [](const TypeRow& r, const std::string& kind) {
    return static_cast<double>(r.elements) / r.best_s.at(kind) / 1e9;
  };
  const std::string fast = kind_name(kinds.back());
  if (o.json) {
    bench::Json types = bench::Json::array();
    for (const TypeRow& r : rows) {
      bench::Json row = {{"model", r.model}, {"type", worker::GgmlTypeName(r.type)}, {"elements", r.elements}};
      for (Isa isa : kinds) row[kind_name(isa) + "_gelem_per_s"] = bench::Round(gelem(r, kind_name(isa)), 3);
      row["fast_over_reference"] = bench::Round(gelem(r, fast) / gelem(r, "reference"), 2);
      types.push_back(std::move(row));
    }
    bench::PrintJson({{"bench", "weights"},
                      {"best_isa", worker::IsaName(worker::BestIsa())},
                      {"threads", 1},
                      {"tile_rows", kTileRows},
                      {"rounds", o.rounds},
                      {"checksum", checksum},
                      {"types", std::move(types)}});
  } else {
    std::printf("%-20s %-6s %12s", "model", "type", "elements");
    for (Isa isa : kinds) std::printf(" %10s", kind_name(isa).c_str());
    std::printf(" %8s   (Gelem/s, 1 thread, best of %d)\n", "ratio", o.rounds);
    for (const TypeRow& r : rows) {
      std::printf("%-20s %-6s %12lld", r.model.c_str(), worker::GgmlTypeName(r.type).c_str(),
                  static_cast<long long>(r.elements));
      for (Isa isa : kinds) std::printf(" %10.3f", gelem(r, kind_name(isa)));
      std::printf(" %7.2fx\n", gelem(r, fast) / gelem(r, "reference"));
    }
  }
  return 0;
}

}  // namespace
}  // namespace polykv::bench

POLYKV_BENCH(weights, "weight dequantization Gelem/s per GGML type: reference vs AVX2/AVX-512",
             [](int argc, char** argv) -> int { return polykv::bench::Main(argc, argv); });
