// polykv-test-worker: a synthetic worker process for integration tests. It
// links libpolykv_client like a real inference worker, writes a pattern into
// its pages through the shared mapping and reads it back.
//
//   run   --socket S --tenant T --agent A --tokens N --seed X [--hold-ms M]
//   hang  --socket S --tenant T --agent A --tokens N --seed X   (until killed)
//   forge --socket S --session ID --token HEX                    (reserve with it)
//   fetch --socket S --session ID --token HEX --arena ID         (fd socket)
//
// Prints one JSON line: {"ok":..., "code":..., "session_id":..., "token":"hex",
// "arenas":[...], "bytes":..., "message":"..."}. Exit 0 when ok.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "polykv/client.h"

namespace {

std::map<std::string, std::string> Flags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 2; i + 1 < argc; i += 2) f[argv[i]] = argv[i + 1];
  return f;
}

uint64_t Num(const std::map<std::string, std::string>& f, const std::string& k, uint64_t d = 0) {
  auto it = f.find(k);
  return it == f.end() ? d : std::stoull(it->second);
}

std::string Escape(absl::string_view s) { return absl::CEscape(s); }

int Report(const absl::Status& s, const std::string& extra = "") {
  std::printf("{\"ok\":%s,\"code\":%d,\"message\":\"%s\"%s}\n", s.ok() ? "true" : "false",
              static_cast<int>(s.code()), Escape(s.message()).c_str(), extra.c_str());
  std::fflush(stdout);
  return s.ok() ? 0 : 1;
}

// The byte at `i` of a page: depends on the seed and the page id, so pages of
// different workers and different pages of one worker all differ.
uint8_t PatternByte(uint64_t seed, uint64_t page_id, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ page_id * 0xC2B2AE3D27D4EB4Full ^ i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 56);
}

int RunWorker(const std::map<std::string, std::string>& f, bool hang) {
  auto client = polykv::Client::Connect(f.at("--socket"));
  if (!client.ok()) return Report(client.status());
  polykv::SessionOptions o;
  o.agent_id = f.at("--agent");
  o.tenant = f.at("--tenant");
  o.profile = {4, 2, 64, polykv::DType::kF32, "test"};
  auto session = (*client)->OpenSession(o);
  if (!session.ok()) return Report(session.status());
  auto& s = **session;
  const uint64_t seed = Num(f, "--seed", 1);
  auto blocks = s.Reserve(Num(f, "--tokens", 64));
  const std::string id = absl::StrCat(",\"session_id\":", s.info().session_id, ",\"token\":\"",
                                      absl::BytesToHexString(s.token()), "\"");
  if (!blocks.ok()) return Report(blocks.status(), id);
  std::set<uint32_t> arenas;
  uint64_t bytes = 0;
  for (const auto& b : *blocks) {
    for (const auto& p : b.pages) {
      auto* mem = static_cast<uint8_t*>(p.addr);
      for (uint64_t i = 0; i < p.size_bytes; ++i) mem[i] = PatternByte(seed, p.page_id, i);
      arenas.insert(p.arena_id);
      bytes += p.size_bytes;
    }
  }
  if (auto st = s.Commit(s.reserved_tokens()); !st.ok()) return Report(st, id);
  const std::string extra = absl::StrCat(id, ",\"arenas\":[", absl::StrJoin(arenas, ","),
                                         "],\"bytes\":", bytes, ",\"pid\":", getpid());
  if (hang) {
    Report(absl::OkStatus(), extra);
    while (true) pause();
  }
  // Another process may write to its own pages meanwhile; ours must stay intact.
  usleep(static_cast<useconds_t>(Num(f, "--hold-ms", 0) * 1000));
  uint64_t bad = 0;
  for (const auto& b : s.blocks()) {
    for (const auto& p : b.pages) {
      const auto* mem = static_cast<const uint8_t*>(p.addr);
      for (uint64_t i = 0; i < p.size_bytes; ++i) bad += mem[i] != PatternByte(seed, p.page_id, i);
    }
  }
  if (bad) {
    return Report(absl::DataLossError(absl::StrCat(bad, " bytes of the pattern changed")), extra);
  }
  return Report(s.Close(), extra);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: polykv-test-worker run|hang|forge|fetch --flag value ...\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto f = Flags(argc, argv);
  if (mode == "run" || mode == "hang") return RunWorker(f, mode == "hang");
  polykv::SessionRef ref{Num(f, "--session"), absl::HexStringToBytes(f["--token"])};
  if (mode == "forge") return Report(polykv::ReserveRaw(f.at("--socket"), ref, 16).status());
  if (mode == "fetch") {
    auto fd = polykv::FetchArenaFd(f.at("--socket") + ".fds", ref,
                                   static_cast<uint32_t>(Num(f, "--arena")));
    if (fd.ok()) close(*fd);
    return Report(fd.status());
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
