// polykv-test-worker: a synthetic worker process for integration tests. It
// links libpolykv_client like a real inference worker, writes a pattern into
// its pages through the shared mapping and reads it back.
//
//   run   --socket S --tenant T --agent A --tokens N --seed X [--hold-ms M]
//   hang  --socket S --tenant T --agent A --tokens N --seed X   (until killed)
//   forge --socket S --session ID --token HEX                    (reserve with it)
//   fetch --socket S --session ID --token HEX --arena ID         (fd socket)
//   agent --socket S --tenant T --agent A --tokens N --seed X --step K --budget B
//         decodes N tokens K per step like an inference worker: Sync at each
//         step boundary (adopting compacted tables and checking that every
//         slot holds the pattern of the position the daemon says it holds),
//         Reserve (retrying pressure refusals), write, Commit, ReportSlots.
//         Adds "epoch", "compactions", "max_committed", "refusals" to the line.
//         With --barrier DIR --barrier-count N it opens its session, then
//         waits until N agents have (files in DIR) before writing, so that
//         all agents hold pages at once however slowly they start.
//   resume --socket S --tenant T --agent A --tokens N --seed X
//         like hang, but waits for SIGCONT or SIGUSR1 (after a SIGSTOP past
//         its lease, or a daemon restart), then makes its next call: a
//         Reserve, retried while UNAVAILABLE (the daemon coming back) for up
//         to 60 s; then opens a new session on the same client (Reserve,
//         Commit, Close). Its second line has "code"/"message" of that call,
//         "unavailable" (retries) and "reopen_code" (0: the new session worked).
//
// Prints one JSON line: {"ok":..., "code":..., "session_id":..., "token":"hex",
// "arenas":[...], "bytes":..., "pid":..., "dumpable":0|1, "message":"..."}.
// Exit 0 when ok.
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/ops.h"
#include "kernels/page_layout.h"
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

// What a resumed worker does first: the call whose answer the fault tests
// check, then a new session to show the worker can carry on.
int Resume(polykv::Client& client, polykv::Session& stale, const polykv::SessionOptions& o) {
  absl::Status call;
  int unavailable = 0;
  for (; unavailable < 300; ++unavailable) {
    call = stale.Reserve(16).status();
    if (!absl::IsUnavailable(call)) break;
    usleep(200000);
  }
  absl::Status reopen;
  if (auto fresh = client.OpenSession(o); !fresh.ok()) {
    reopen = fresh.status();
  } else if (auto r = (*fresh)->Reserve(16); !r.ok()) {
    reopen = r.status();
  } else if (reopen = (*fresh)->Commit(16); reopen.ok()) {
    reopen = (*fresh)->Close();
  }
  std::printf("{\"ok\":%s,\"code\":%d,\"message\":\"%s\",\"unavailable\":%d,"
              "\"reopen_code\":%d,\"reopen_message\":\"%s\"}\n",
              reopen.ok() ? "true" : "false", static_cast<int>(call.code()),
              Escape(call.message()).c_str(), unavailable, static_cast<int>(reopen.code()),
              Escape(reopen.message()).c_str());
  std::fflush(stdout);
  return reopen.ok() ? 0 : 1;
}

// mode: "run", "hang" or "resume".
int RunWorker(const std::map<std::string, std::string>& f, const std::string& mode) {
  sigset_t wake;
  sigemptyset(&wake);
  sigaddset(&wake, SIGCONT);
  sigaddset(&wake, SIGUSR1);
  // Blocked before the client starts its threads, so they inherit the mask
  // and sigwait below is the only taker.
  if (mode == "resume") pthread_sigmask(SIG_BLOCK, &wake, nullptr);
  auto client = polykv::Client::Connect(f.at("--socket"));
  if (!client.ok()) return Report(client.status());
  polykv::SessionOptions o;
  o.agent_id = f.at("--agent");
  o.tenant = f.at("--tenant");
  o.profile = {4, 2, 64, polykv::DType::kF32, "test"};
  // Exact f32 pages on 16-token blocks, whatever the agent's QoS: the tests
  // count these pages' bytes and check their values exactly.
  o.key_format = o.value_format = polykv::PageFormat::kF32;
  o.block_tokens = 16;
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
                                         "],\"bytes\":", bytes, ",\"pid\":", getpid(),
                                         ",\"dumpable\":", prctl(PR_GET_DUMPABLE));
  if (mode == "hang") {
    Report(absl::OkStatus(), extra);
    while (true) pause();
  }
  if (mode == "resume") {
    Report(absl::OkStatus(), extra);
    int sig = 0;
    sigwait(&wake, &sig);
    return Resume(**client, s, o);
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

// Value of element (h, d) of token `pos`'s K (kv = 0) or V (kv = 1) in
// `layer`; an integer below 2^24, so exact in f32.
float AgentPattern(uint64_t seed, int64_t pos, int layer, int kv, int h, int d) {
  return float((seed * 7919 + uint64_t(pos) * 131 + uint64_t(layer) * 17 + uint64_t(kv) * 7 +
                uint64_t(h) * 3 + uint64_t(d)) % 1000003);
}

constexpr int kLayers = 4, kHeads = 2, kDim = 64;

// The bytes of a page in a scaled or narrower float format that differ from
// `pattern(t, h, d)` for its first `rows` rows encoded in that format (the
// kernels' codes are the same on every backend, so the comparison is exact).
template <typename Pattern>
uint64_t RequantizedPageDiffers(const polykv::Page& page, int bt, int rows, Pattern pattern,
                                bool is_value) {
  const polykv::kernels::PageShape shape{bt, kHeads, kDim};
  const polykv::kernels::PageGeom geom{bt, kHeads, kDim};
  const auto kind = is_value ? polykv::kernels::KvKind::kValue : polykv::kernels::KvKind::kKey;
  std::vector<float> dense(size_t(rows) * kHeads * kDim);
  for (int t = 0; t < rows; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      for (int d = 0; d < kDim; ++d) dense[geom.DenseIndex(t, h, d)] = pattern(t, h, d);
    }
  }
  const size_t bytes = geom.PageBytes(page.format, kind);
  const size_t meaningful = geom.DataBytes(page.format) + geom.NumParams(page.format, kind) * 4;
  std::unique_ptr<uint8_t, decltype(&std::free)> want(
      static_cast<uint8_t*>(std::aligned_alloc(polykv::kernels::kPageAlignment, bytes)),
      &std::free);
  if (!polykv::kernels::QuantizePage({}, shape, kind, page.format, dense.data(),
                                     polykv::kernels::SourceType::kF32, rows, want.get())
           .ok()) {
    return meaningful;
  }
  const auto* got = static_cast<const uint8_t*>(page.addr);
  uint64_t differ = 0;
  for (size_t i = 0; i < meaningful; ++i) differ += got[i] != want.get()[i];
  return differ;
}

int RunAgent(const std::map<std::string, std::string>& f) {
  auto client = polykv::Client::Connect(f.at("--socket"));
  if (!client.ok()) return Report(client.status());
  polykv::SessionOptions o;
  o.agent_id = f.at("--agent");
  o.tenant = f.at("--tenant");
  o.profile = {kLayers, kHeads, kDim, polykv::DType::kF32, "test"};
  o.key_format = o.value_format = polykv::PageFormat::kF32;  // patterns checked exactly
  o.block_tokens = 16;
  auto session = (*client)->OpenSession(o);
  if (!session.ok()) return Report(session.status());
  auto& s = **session;
  if (auto it = f.find("--barrier"); it != f.end()) {
    const std::string dir = it->second;
    const uint64_t want = Num(f, "--barrier-count", 1);
    if (std::FILE* mark = std::fopen((dir + "/" + f.at("--agent")).c_str(), "w")) std::fclose(mark);
    for (int waited_ms = 0;; waited_ms += 10) {
      uint64_t ready = 0;
      for (const auto& e : std::filesystem::directory_iterator(dir)) ready += e.is_regular_file();
      if (ready >= want) break;
      if (waited_ms > 120000) return Report(absl::DeadlineExceededError("barrier: agents missing"));
      usleep(10000);
    }
  }
  const uint64_t seed = Num(f, "--seed", 1);
  const uint64_t total = Num(f, "--tokens", 1024);
  const uint64_t step = Num(f, "--step", 16);
  const uint64_t budget = Num(f, "--budget", 0);
  const int bt = static_cast<int>(s.info().block_tokens);
  std::vector<int64_t> positions;  // [committed] position held by each slot
  std::vector<polykv::Block> table;  // the tables this worker reads
  uint64_t committed = 0, epoch = 0, compactions = 0, max_committed = 0, refusals = 0;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  auto elem = [&](const polykv::Page& p, int t, int h, int d) {
    return static_cast<float*>(p.addr) + (size_t(h) * bt + t) * kDim + d;  // f32, [h][t][d]
  };
  auto stats = [&] {
    return absl::StrCat(",\"session_id\":", s.info().session_id, ",\"epoch\":", epoch,
                        ",\"compactions\":", compactions, ",\"max_committed\":", max_committed,
                        ",\"refusals\":", refusals);
  };
  for (int64_t next_pos = 0; uint64_t(next_pos) < total;) {
    // Step boundary: adopt a newer table, then check every slot we may read.
    auto changed = s.Sync();
    if (!changed.ok()) return Report(changed.status(), stats());
    if (*changed) {
      ++compactions;
      epoch = s.epoch();
      table = s.blocks();
      committed = s.committed_tokens();
      positions = s.slot_positions();
      if (positions.size() != committed) {
        return Report(absl::InternalError("slot_positions do not cover the committed slots"),
                      stats());
      }
      for (uint64_t i = 1; i < committed; ++i) {
        if (positions[i] <= positions[i - 1]) {
          return Report(absl::InternalError("slots out of position order"), stats());
        }
      }
      if (budget > 0 && committed > budget) {
        return Report(absl::InternalError(absl::StrCat("compacted to ", committed,
                                                       " slots, over the budget ", budget)),
                      stats());
      }
    }
    uint64_t bad = 0;
    for (uint64_t first = 0; first < committed; first += uint64_t(bt)) {
      const auto& b = table[first / bt];
      const int rows = static_cast<int>(std::min<uint64_t>(bt, committed - first));
      for (int l = 0; l < kLayers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const polykv::Page& page = b.pages[2 * l + kv];
          if (page.format == polykv::PageFormat::kF32) {
            for (int t = 0; t < rows; ++t) {
              for (int h = 0; h < kHeads; ++h) {
                for (int d = 0; d < kDim; d += 7) {
                  bad += *elem(page, t, h, d) !=
                         AgentPattern(seed, positions[first + t], l, kv, h, d);
                }
              }
            }
            continue;
          }
          // The pressure ladder requantized this page (lower precision for a
          // low-priority agent): it must hold exactly the codes of our
          // pattern encoded in its format.
          bad += RequantizedPageDiffers(page, bt, rows, [&](int t, int h, int d) {
            return AgentPattern(seed, positions[first + t], l, kv, h, d);
          }, kv == 1);
        }
      }
    }
    if (bad) {
      return Report(absl::DataLossError(absl::StrCat(bad, " values (bytes of requantized pages) "
                                                     "differ from their position's pattern at "
                                                     "epoch ", epoch)),
                    stats());
    }
    const uint64_t n = std::min<uint64_t>(step, total - uint64_t(next_pos));
    // Reserve; a pool under pressure refuses with a retry hint: Sync, retry.
    while (committed + n > table.size() * uint64_t(bt)) {
      auto r = s.Reserve(committed + n - table.size() * uint64_t(bt));
      if (r.ok()) {
        for (auto& b : *r) table.push_back(b);
        break;
      }
      if (r.status().code() != absl::StatusCode::kResourceExhausted || ++refusals > 2000) {
        return Report(r.status(), stats());
      }
      usleep(5000);
      break;  // back to the step boundary (Sync) before retrying
    }
    if (committed + n > table.size() * uint64_t(bt)) continue;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t slot = committed + i;
      const auto& b = table[slot / bt];
      for (int l = 0; l < kLayers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < kHeads; ++h) {
            for (int d = 0; d < kDim; ++d) {
              *elem(b.pages[2 * l + kv], int(slot % bt), h, d) =
                  AgentPattern(seed, next_pos + int64_t(i), l, kv, h, d);
            }
          }
        }
      }
      positions.push_back(next_pos + int64_t(i));
    }
    if (auto st = s.Commit(committed + n); !st.ok()) return Report(st, stats());
    // Metadata of the new slots and attention mass over all of them.
    std::vector<polykv::SlotMeta> meta(n);
    const uint32_t turn = uint32_t(next_pos / 64);
    for (auto& m : meta) {
      m.turn = turn;
      m.role = turn % 2 ? polykv::Role::kAssistant : polykv::Role::kUser;
    }
    std::vector<float> attention(committed + n);
    for (auto& a : attention) a = float(rng() % 1000) / 1000.f;
    if (auto st = s.ReportSlots(0, {}, attention, turn); !st.ok()) return Report(st, stats());
    if (auto st = s.ReportSlots(committed, meta, {}); !st.ok()) return Report(st, stats());
    committed += n;
    max_committed = std::max(max_committed, committed);
    next_pos += int64_t(n);
  }
  return Report(s.Close(), stats());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: polykv-test-worker run|hang|resume|agent|forge|fetch --flag value ...\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto f = Flags(argc, argv);
  if (mode == "run" || mode == "hang" || mode == "resume") return RunWorker(f, mode);
  if (mode == "agent") return RunAgent(f);
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
