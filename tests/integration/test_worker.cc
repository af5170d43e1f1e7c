// polykv-test-worker: a synthetic worker process for integration tests. It
// links libpolykv_client like a real inference worker, writes a pattern into
// its pages through the shared mapping and reads it back.
//
//   run   --socket S --tenant T --agent A --tokens N --seed X [--hold-ms M]
//   hang  --socket S --tenant T --agent A --tokens N --seed X   (until killed)
//         run, hang and resume take [--lease-ms L] (0: the daemon's default)
//         and [--device 1]: pages on the daemon's GPU (PageMemory::kDevice),
//         written and read back with device copies; the line then names the
//         first page ("page_arena", "page_offset", "page_id", "page_bytes",
//         "cuda_device") for peek
//   peek  --socket S --session ID --token HEX --arena ID
//         --offset O --page-id P --page-bytes N --seed X --cuda-device D
//         maps a device arena in this process (fd socket, VMM import) and
//         checks that the page holds the pattern another process wrote
//   share --socket S --tenant T --agent A --tokens N --seed X --ids Y
//         like hang, and shares its N tokens (SharePrefix) as ids Y, Y+1, ...;
//         adds "shared" (tokens shared) to its line, then waits until killed
//   attach --socket S --tenant T --agent A --tokens N --seed X --ids Y [--hold-ms M]
//         a fresh session attaches (AttachPrefix) ids Y, Y+1, ... (N of them),
//         waits M ms, then checks that every attached page still holds the
//         pattern seed X wrote (the sharer's); adds "attached" to its line
//   forge --socket S --session ID --token HEX                    (reserve with it)
//   fetch --socket S --session ID --token HEX --arena ID         (fd socket)
//   agent --socket S --tenant T --agent A --tokens N --seed X --step K --budget B
//         [--device 1]
//         decodes N tokens K per step like an inference worker: Sync at each
//         step boundary (adopting compacted tables and checking that every
//         slot holds the pattern of the position the daemon says it holds),
//         Reserve (retrying pressure refusals), write, Commit, ReportSlots.
//         Adds "epoch", "compactions", "max_committed", "refusals" to the line.
//         With --idle-every J --idle-ms M it says Idle after every J-th step
//         and waits M ms (a daemon with an offload tier may take its pages
//         meanwhile; the next Sync brings them back, checked as above); adds
//         "idles".
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

#include <cmath>
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
#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/page_layout.h"
#include "client/worker/json.h"
#include "polykv/client.h"

namespace {

using polykv::worker::JsonQuote;

std::map<std::string, std::string> Flags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 2; i + 1 < argc; i += 2) f[argv[i]] = argv[i + 1];
  return f;
}

uint64_t Num(const std::map<std::string, std::string>& f, const std::string& k, uint64_t d = 0) {
  auto it = f.find(k);
  return it == f.end() ? d : std::stoull(it->second);
}

int Report(const absl::Status& s, const std::string& extra = "") {
  std::printf("{\"ok\":%s,\"code\":%d,\"message\":%s%s}\n", s.ok() ? "true" : "false",
              static_cast<int>(s.code()), JsonQuote(std::string(s.message())).c_str(),
              extra.c_str());
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

// Fills a page with its pattern, through a device copy where it is on the GPU.
absl::Status WritePattern(const polykv::Page& p, uint64_t seed) {
  std::vector<uint8_t> bytes(p.size_bytes);
  for (uint64_t i = 0; i < p.size_bytes; ++i) bytes[i] = PatternByte(seed, p.page_id, i);
  if (p.on_device) return polykv::kernels::CopyToDevice(p.addr, bytes.data(), bytes.size());
  std::memcpy(p.addr, bytes.data(), bytes.size());
  return absl::OkStatus();
}

// The bytes of [addr, addr + size) that differ from page `page_id`'s pattern.
absl::StatusOr<uint64_t> BytesOffPattern(const void* addr, bool on_device, uint64_t size,
                                         uint64_t seed, uint64_t page_id) {
  std::vector<uint8_t> bytes(size);
  if (on_device) {
    if (auto st = polykv::kernels::CopyToHost(bytes.data(), addr, size); !st.ok()) return st;
  } else {
    std::memcpy(bytes.data(), addr, size);
  }
  uint64_t bad = 0;
  for (uint64_t i = 0; i < size; ++i) bad += bytes[i] != PatternByte(seed, page_id, i);
  return bad;
}

// peek: another process's page, read through this process's own import of
// the daemon's device arena.
int Peek(const std::map<std::string, std::string>& f, const polykv::SessionRef& ref) {
  uint64_t arena_bytes = 0;
  auto fd = polykv::FetchArenaFd(f.at("--socket") + ".fds", ref,
                                 static_cast<uint32_t>(Num(f, "--arena")), &arena_bytes);
  if (!fd.ok()) return Report(fd.status());
  auto memory = polykv::kernels::SharedDeviceMemory::ImportFd(
      static_cast<int>(Num(f, "--cuda-device")), *fd, arena_bytes);
  close(*fd);
  if (!memory.ok()) return Report(memory.status());
  const uint64_t offset = Num(f, "--offset"), size = Num(f, "--page-bytes");
  if (offset + size > (*memory)->size()) {
    return Report(absl::InvalidArgumentError("page outside the arena"));
  }
  auto bad = BytesOffPattern(static_cast<const uint8_t*>((*memory)->ptr()) + offset, true, size,
                             Num(f, "--seed"), Num(f, "--page-id"));
  if (!bad.ok()) return Report(bad.status());
  if (*bad) {
    return Report(absl::DataLossError(absl::StrCat(*bad, " bytes differ from the pattern")));
  }
  return Report(absl::OkStatus(), absl::StrCat(",\"checked_bytes\":", size));
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
  std::printf("{\"ok\":%s,\"code\":%d,\"message\":%s,\"unavailable\":%d,"
              "\"reopen_code\":%d,\"reopen_message\":%s}\n",
              reopen.ok() ? "true" : "false", static_cast<int>(call.code()),
              JsonQuote(std::string(call.message())).c_str(), unavailable,
              static_cast<int>(reopen.code()), JsonQuote(std::string(reopen.message())).c_str());
  std::fflush(stdout);
  return reopen.ok() ? 0 : 1;
}

// The session every mode opens: 4 layers of exact f32 pages on 16-token
// blocks, whatever the agent's QoS (the tests count these pages' bytes and
// check their values exactly).
polykv::SessionOptions TestSessionOptions(const std::map<std::string, std::string>& f) {
  polykv::SessionOptions o;
  o.agent_id = f.at("--agent");
  o.tenant = f.at("--tenant");
  o.profile = {4, 2, 64, polykv::DType::kF32, "test"};
  o.key_format = o.value_format = polykv::PageFormat::kF32;
  o.block_tokens = 16;
  o.lease_ms = static_cast<uint32_t>(Num(f, "--lease-ms", 0));
  if (Num(f, "--device", 0) != 0) o.page_memory = polykv::PageMemory::kDevice;
  return o;
}

std::vector<int32_t> PrefixIds(const std::map<std::string, std::string>& f) {
  std::vector<int32_t> ids(Num(f, "--tokens", 64));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(Num(f, "--ids") + i);
  return ids;
}

// The bytes of `blocks`' pages that differ from their pattern under `seed`.
absl::StatusOr<uint64_t> BlocksOffPattern(const std::vector<polykv::Block>& blocks,
                                          uint64_t seed) {
  uint64_t bad = 0;
  for (const auto& b : blocks) {
    for (const auto& p : b.pages) {
      auto off = BytesOffPattern(p.addr, p.on_device, p.size_bytes, seed, p.page_id);
      if (!off.ok()) return off.status();
      bad += *off;
    }
  }
  return bad;
}

// attach: a fresh session takes the shared prefix and reads the sharer's pages.
int Attach(polykv::Client& client, const std::map<std::string, std::string>& f) {
  auto session = client.OpenSession(TestSessionOptions(f));
  if (!session.ok()) return Report(session.status());
  auto& s = **session;
  auto attached = s.AttachPrefix(PrefixIds(f));
  if (!attached.ok()) return Report(attached.status());
  usleep(static_cast<useconds_t>(Num(f, "--hold-ms", 0) * 1000));
  auto bad = BlocksOffPattern(s.blocks(), Num(f, "--seed", 1));
  const std::string extra = absl::StrCat(",\"attached\":", *attached);
  if (!bad.ok()) return Report(bad.status(), extra);
  if (*bad) {
    return Report(absl::DataLossError(absl::StrCat(*bad, " bytes of the sharer's pattern changed")),
                  extra);
  }
  return Report(s.Close(), extra);
}

// mode: "run", "hang", "resume", "share" or "attach".
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
  if (mode == "attach") return Attach(**client, f);
  const polykv::SessionOptions o = TestSessionOptions(f);
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
      if (auto st = WritePattern(p, seed); !st.ok()) return Report(st, id);
      arenas.insert(p.arena_id);
      bytes += p.size_bytes;
    }
  }
  if (auto st = s.Commit(s.reserved_tokens()); !st.ok()) return Report(st, id);
  std::string extra = absl::StrCat(id, ",\"arenas\":[", absl::StrJoin(arenas, ","),
                                   "],\"bytes\":", bytes, ",\"pid\":", getpid(),
                                   ",\"dumpable\":", prctl(PR_GET_DUMPABLE));
  if (!blocks->empty() && !blocks->front().pages.empty()) {
    const polykv::Page& first = blocks->front().pages.front();
    absl::StrAppend(&extra, ",\"page_arena\":", first.arena_id, ",\"page_offset\":",
                    first.offset, ",\"page_id\":", first.page_id, ",\"page_bytes\":",
                    first.size_bytes, ",\"cuda_device\":", s.info().cuda_device);
  }
  if (mode == "share") {
    auto shared = s.SharePrefix(PrefixIds(f));
    if (!shared.ok()) return Report(shared.status(), extra);
    absl::StrAppend(&extra, ",\"shared\":", *shared);
  }
  if (mode == "hang" || mode == "share") {
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
  auto bad = BlocksOffPattern(s.blocks(), seed);
  if (!bad.ok()) return Report(bad.status(), extra);
  if (*bad) {
    return Report(absl::DataLossError(absl::StrCat(*bad, " bytes of the pattern changed")), extra);
  }
  return Report(s.Close(), extra);
}

// Value of element (h, d) of token `pos`'s K (kv = 0) or V (kv = 1) in
// `layer`: a base per (position, layer, kv, head) below 2039 (a prime, so
// positions less than 2039 apart get different bases), plus d / 8 — exact in
// f32 and f16, and within a row (a value group) a range of 8, so a page the
// pressure ladder stores at lower precision still tells positions apart.
float AgentPattern(uint64_t seed, int64_t pos, int layer, int kv, int h, int d) {
  return float((seed * 7919 + uint64_t(pos) * 131 + uint64_t(layer) * 17 + uint64_t(kv) * 7 +
                uint64_t(h) * 3) % 2039) + float(d) / 8.0f;
}

constexpr int kLayers = 4, kHeads = 2, kDim = 64;

// How far from the pattern an element of a page in `format` may be: the
// error of one encoding of AgentPattern's rows in it (int: half a step of a
// group whose range is under 10; floats: half a unit in the last place below
// 2048). Re-encoding a moved slot stays within the group's range.
float LossyTolerance(polykv::PageFormat format) {
  switch (format) {
    case polykv::PageFormat::kF32: return 0;
    case polykv::PageFormat::kF16: return 0.5f;
    case polykv::PageFormat::kBF16: return 4;
    case polykv::PageFormat::kFP8E4M3: return 64;
    case polykv::PageFormat::kInt8: return 0.5f;
    case polykv::PageFormat::kInt4: return 1;
    case polykv::PageFormat::kInt2: return 4;
  }
  return 0;
}

// Pages' bytes in this process's memory: host pages in place, device pages
// as host copies, written back by WriteBack (the agent's writes).
class HostPages {
 public:
  absl::StatusOr<uint8_t*> Get(const polykv::Page& p) {
    if (!p.on_device) return static_cast<uint8_t*>(p.addr);
    auto [it, added] = staged_.try_emplace(p.addr);
    if (added) {
      it->second.first = p.size_bytes;
      it->second.second.resize(p.size_bytes);
      if (auto st = polykv::kernels::CopyToHost(it->second.second.data(), p.addr, p.size_bytes);
          !st.ok()) {
        return st;
      }
    }
    return it->second.second.data();
  }
  absl::Status WriteBack() {
    for (auto& [addr, page] : staged_) {
      if (auto st = polykv::kernels::CopyToDevice(addr, page.second.data(), page.first);
          !st.ok()) {
        return st;
      }
    }
    staged_.clear();
    return absl::OkStatus();
  }

 private:
  std::map<void*, std::pair<size_t, std::vector<uint8_t>>> staged_;  // device addr -> bytes
};

// The elements among the first `rows` rows of `page` farther than `tolerance`
// from `pattern(t, h, d)`, read through the kernels' decoder (any format).
template <typename Pattern>
uint64_t ElementsOffPattern(const polykv::Page& page, int bt, int rows, bool is_value,
                            float tolerance, Pattern pattern) {
  const polykv::kernels::PageGeom geom{bt, kHeads, kDim};
  std::vector<float> dense(size_t(rows) * kHeads * kDim);
  HostPages host;
  auto bytes = host.Get(page);
  if (!bytes.ok() ||
      !polykv::kernels::DequantizePage(
           {}, polykv::kernels::PageShape{bt, kHeads, kDim},
           is_value ? polykv::kernels::KvKind::kValue : polykv::kernels::KvKind::kKey,
           page.format, *bytes, rows, dense.data())
           .ok()) {
    return dense.size();
  }
  uint64_t off = 0;
  for (int t = 0; t < rows; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      for (int d = 0; d < kDim; ++d) {
        off += !(std::fabs(dense[geom.DenseIndex(t, h, d)] - pattern(t, h, d)) <= tolerance);
      }
    }
  }
  return off;
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
  if (Num(f, "--device", 0) != 0) o.page_memory = polykv::PageMemory::kDevice;
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
  const uint64_t idle_every = Num(f, "--idle-every", 0), idle_ms = Num(f, "--idle-ms", 0);
  const int bt = static_cast<int>(s.info().block_tokens);
  std::vector<int64_t> positions;  // [committed] position held by each slot
  float lossy[2] = {0, 0};         // [kv] tolerance since a K / V page was stored lossily
  std::vector<polykv::Block> table;  // the tables this worker reads
  uint64_t committed = 0, epoch = 0, compactions = 0, max_committed = 0, refusals = 0, steps = 0;
  uint64_t idles = 0;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  HostPages writes;
  auto elem = [&](const polykv::Page& p, int t, int h, int d) -> absl::StatusOr<float*> {
    auto bytes = writes.Get(p);
    if (!bytes.ok()) return bytes.status();
    return reinterpret_cast<float*>(*bytes) + (size_t(h) * bt + t) * kDim + d;  // f32, [h][t][d]
  };
  auto stats = [&] {
    return absl::StrCat(",\"session_id\":", s.info().session_id, ",\"epoch\":", epoch,
                        ",\"compactions\":", compactions, ",\"max_committed\":", max_committed,
                        ",\"refusals\":", refusals, ",\"idles\":", idles);
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
          // Once the ladder stored some of our K or V at lower precision
          // (a low-priority agent under pressure), a later compaction may
          // move those slots into pages of any format: from then on this
          // kind is checked within the lossiest format's error, not exactly.
          lossy[kv] = std::max(lossy[kv], LossyTolerance(page.format));
          bad += ElementsOffPattern(page, bt, rows, kv == 1, lossy[kv], [&](int t, int h, int d) {
            return AgentPattern(seed, positions[first + t], l, kv, h, d);
          });
        }
      }
    }
    if (bad) {
      return Report(absl::DataLossError(absl::StrCat(bad, " values differ from their position's "
                                                     "pattern at epoch ", epoch)),
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
              auto e = elem(b.pages[2 * l + kv], int(slot % bt), h, d);
              if (!e.ok()) return Report(e.status(), stats());
              **e = AgentPattern(seed, next_pos + int64_t(i), l, kv, h, d);
            }
          }
        }
      }
      positions.push_back(next_pos + int64_t(i));
    }
    if (auto st = writes.WriteBack(); !st.ok()) return Report(st, stats());
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
    if (auto st = s.Report(polykv::ScoreStream::kAttention, 0, std::move(attention)); !st.ok()) {
      return Report(st, stats());
    }
    if (auto st = s.ReportSlots(committed, meta, {}, turn); !st.ok()) return Report(st, stats());
    committed += n;
    max_committed = std::max(max_committed, committed);
    next_pos += int64_t(n);
    if (idle_every > 0 && ++steps % idle_every == 0 && uint64_t(next_pos) < total) {
      if (auto st = s.Idle(); !st.ok()) return Report(st, stats());
      ++idles;
      usleep(static_cast<useconds_t>(idle_ms * 1000));
    }
  }
  return Report(s.Close(), stats());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: polykv-test-worker run|hang|resume|share|attach|agent|forge|fetch|peek "
                 "--flag value ...\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto f = Flags(argc, argv);
  if (mode == "run" || mode == "hang" || mode == "resume" || mode == "share" ||
      mode == "attach") {
    return RunWorker(f, mode);
  }
  if (mode == "agent") return RunAgent(f);
  polykv::SessionRef ref{Num(f, "--session"), absl::HexStringToBytes(f["--token"])};
  if (mode == "forge") return Report(polykv::ReserveRaw(f.at("--socket"), ref, 16).status());
  if (mode == "fetch") {
    auto fd = polykv::FetchArenaFd(f.at("--socket") + ".fds", ref,
                                   static_cast<uint32_t>(Num(f, "--arena")));
    if (fd.ok()) close(*fd);
    return Report(fd.status());
  }
  if (mode == "peek") return Peek(f, ref);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
