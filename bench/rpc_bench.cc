// polykv-bench rpc: negotiation latency and allocator throughput, each next
// to its floor measured in the same run.
//
//  - reserve+commit round trip (Reserve of one block, then Commit) against an
//    in-process polykvd on a Unix socket, 1 and 8 concurrent clients;
//  - a plain gRPC echo on the same kind of socket (accepted by the same
//    peer-checking listener), 1 and 8 clients — the floor;
//  - PageAllocator alloc/free ops/s next to malloc/free of the same sizes.
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "bench/echo.grpc.pb.h"
#include "daemon/daemon.h"
#include "daemon/pool/page_allocator.h"
#include "daemon/rpc/uds_listener.h"
#include "polykv/client.h"

namespace polykv::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Latency {
  double p50_us = 0, p99_us = 0, mean_us = 0;
  size_t samples = 0;
};

Latency Summarize(std::vector<double> us) {
  Latency l;
  if (us.empty()) return l;
  std::sort(us.begin(), us.end());
  l.samples = us.size();
  l.p50_us = us[us.size() / 2];
  l.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  double sum = 0;
  for (double x : us) sum += x;
  l.mean_us = sum / double(us.size());
  return l;
}

bench::Json ToJson(const Latency& l) {
  return {{"p50_us", bench::Round(l.p50_us, 1)},
          {"p99_us", bench::Round(l.p99_us, 1)},
          {"mean_us", bench::Round(l.mean_us, 1)},
          {"samples", l.samples}};
}

class EchoService final : public Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const EchoMessage* req, EchoMessage* resp) override {
    *resp = *req;
    return grpc::Status::OK;
  }
};

// Runs `clients` threads, each calling `op` `iters` times after a warm-up;
// returns all per-call latencies.
template <typename MakeOp>
std::vector<double> Measure(int clients, int iters, MakeOp make_op) {
  std::vector<std::vector<double>> per(clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto op = make_op(c);
      for (int i = 0; i < 50; ++i) op();
      per[c].reserve(iters);
      for (int i = 0; i < iters; ++i) {
        auto t0 = Clock::now();
        op();
        per[c].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
  return all;
}

int Main(int argc, char** argv) {
  bool json = false;
  int iters = 2000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: polykv-bench rpc [--json] [--iters N (per client, default 2000)]\n");
      return std::strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  char tmpl[] = "/tmp/polykv-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);

  daemon::DaemonConfig cfg;
  cfg.socket = dir + "/d.sock";
  cfg.metrics_address = "off";
  cfg.pool_bytes = 1ull << 30;
  auto d = daemon::Daemon::Create(cfg);
  if (!d.ok() || !(*d)->Start().ok()) {
    std::fprintf(stderr, "polykv-bench: cannot start polykvd in-process\n");
    return 1;
  }

  // The echo server: same listener kind (peer-checked Unix socket, fd handed to gRPC).
  EchoService echo;
  grpc::ServerBuilder builder;
  builder.RegisterService(&echo);
  auto echo_server = builder.BuildAndStart();
  daemon::UdsListenerOptions lo;
  lo.path = dir + "/echo.sock";
  lo.policy.allowed_uids = {0, geteuid()};
  lo.on_accept = [&](const daemon::Connection& c) {
    grpc::AddInsecureChannelFromFd(echo_server.get(), c.fd);
  };
  auto listener = daemon::UdsListener::Create(lo);
  if (!listener.ok()) {
    std::fprintf(stderr, "polykv-bench: %s\n", std::string(listener.status().message()).c_str());
    return 1;
  }
  (*listener)->Start();

  bench::Json out = {{"benchmark", "rpc"}, {"iters_per_client", iters}};
  for (int clients : {1, 8}) {
    std::fprintf(stderr, "rpc: echo, %d client(s)...\n", clients);
    std::vector<std::unique_ptr<Echo::Stub>> stubs;
    auto echo_lat = Summarize(Measure(clients, iters, [&](int) {
      auto ch = grpc::CreateChannel("unix:" + dir + "/echo.sock", grpc::InsecureChannelCredentials());
      auto stub = std::shared_ptr<Echo::Stub>(Echo::NewStub(ch));
      return [stub] {
        grpc::ClientContext ctx;
        EchoMessage req, resp;
        req.set_payload(std::string(64, 'x'));
        (void)stub->Echo(&ctx, req, &resp);
      };
    }));
    std::fprintf(stderr, "rpc: reserve+commit, %d client(s)...\n", clients);
    std::vector<std::unique_ptr<Client>> keep;
    std::atomic<int> errors{0};
    auto rc_lat = Summarize(Measure(clients, iters, [&](int c) {
      auto client = std::shared_ptr<Client>(*Client::Connect(cfg.socket));
      SessionOptions o;
      o.agent_id = "bench-" + std::to_string(c);
      o.profile = {30, 3, 64, DType::kF16, "smollm2-135m"};  // SmolLM2-135M's shape
      auto session = std::shared_ptr<Session>(*client->OpenSession(o));
      return [client, session, &errors, n = uint64_t(0)]() mutable {
        // One block (16 tokens, 30 layers x K/V = 60 pages) per Reserve,
        // committed; released every 64 blocks so the pool stays small.
        if (!session->Reserve(16).ok()) ++errors;
        n += 16;
        if (!session->Commit(n).ok()) ++errors;
        if (n >= 64 * 16) {
          (void)session->Release(0);
          n = 0;
        }
      };
    }));
    if (errors) std::fprintf(stderr, "rpc: %d failed calls\n", errors.load());
    const std::string k = std::to_string(clients);
    out["clients_" + k] = {{"reserve_commit", ToJson(rc_lat)},
                           {"echo", ToJson(echo_lat)},
                           {"p50_ratio_vs_echo", bench::Round(rc_lat.p50_us / echo_lat.p50_us, 2)},
                           {"p99_ratio_vs_echo", bench::Round(rc_lat.p99_us / echo_lat.p99_us, 2)}};
  }

  // Allocator: bursts of 1024 allocations then 1024 frees, mixed sizes.
  std::fprintf(stderr, "rpc: allocator vs malloc...\n");
  const uint64_t sizes[] = {6144, 3328, 1792, 12288};
  const int rounds = 400, burst = 1024;
  daemon::PageAllocator alloc({2ull << 20});
  (void)alloc.AddArena(1, 256ull << 20);
  std::vector<daemon::PageId> ids(burst);
  auto t0 = Clock::now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < burst; ++i) ids[i] = *alloc.Alloc(sizes[(r + i) & 3]);
    for (int i = 0; i < burst; ++i) (void)alloc.Free(ids[i]);
  }
  const double alloc_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<void*> ptrs(burst);
  t0 = Clock::now();
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < burst; ++i) ptrs[i] = std::malloc(sizes[(r + i) & 3]);
    for (int i = 0; i < burst; ++i) std::free(ptrs[i]);
  }
  const double malloc_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double ops = 2.0 * rounds * burst;
  out["allocator"] = {{"alloc_free_ops_per_s", bench::Round(ops / alloc_s, 0)},
                      {"malloc_free_ops_per_s", bench::Round(ops / malloc_s, 0)},
                      {"ratio_vs_malloc", bench::Round(malloc_s / alloc_s, 2)}};
  (*listener)->Stop();
  echo_server->Shutdown();
  (*d)->Shutdown();
  // The output is the same JSON with or without --json (kept for the common
  // polykv-bench interface); progress went to stderr.
  (void)json;
  bench::PrintJson(out);
  return 0;
}

}  // namespace

POLYKV_BENCH(rpc, "Reserve+commit latency vs a gRPC echo floor; allocator vs malloc", Main);

}  // namespace polykv::bench
