// Fuzz target: polykvd's gRPC surface. An in-process Daemon (temp socket
// folder, small pool, metrics off) gets each command's payload as the raw
// bytes of a call to the method its op names, through a GenericStub, so
// the bytes meet gRPC's own parsing before the services'. Every call must
// end with a status (a unary call still open after 30 s is a hang); a
// payload that parses as the method's request must not get an unexpected
// code (INTERNAL, UNKNOWN, DATA_LOSS). After each input the pool's
// invariants must hold and the daemon must still serve a Heartbeat (or,
// when the input closed the setup session, a new OpenSession).
//
// Input: commands as in fuzz_input.h, at most 16.
//   op:     255 Admin/Drain (the daemon is restarted after it), 254 a method
//           that does not exist, else op % 17 indexes kMethods.
//   flags:  0x01 prefix the payload with the setup session's SessionRef
//           (for EvictSession its id, for SetQos its agent id); protobuf
//           merges fields, so the fuzzer's bytes still decide the rest.
//           0x02 with 0x01: the session this input opened last instead.
//
// Unlike the other targets the daemon lives across inputs (a restart costs
// about 3 ms, ten inputs' worth). The sessions an input
// opens are closed after it; the daemon is restarted after a Drain, every
// kRestartEvery inputs and should sessions pile up anyway, so a finding may
// need the inputs before it (libFuzzer keeps them in its crash log).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "daemon/daemon.h"
#include "daemon/rpc/status_map.h"
#include "polykv/v1/admin.grpc.pb.h"
#include "polykv/v1/session.grpc.pb.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_support.h"

namespace polykv::fuzz {
namespace {

constexpr int kMaxCommands = 16;
constexpr int kRestartEvery = 5000;
constexpr uint32_t kMaxFuzzSessions = 64;

enum class Prefix { kNone, kSessionRef, kSessionId, kAgent };

struct Method {
  const char* name;
  const google::protobuf::Message& request;
  Prefix prefix;
};

const Method kMethods[] = {
    {"/polykv.v1.Session/OpenSession", v1::OpenSessionRequest::default_instance(), Prefix::kNone},
    {"/polykv.v1.Session/Reserve", v1::ReserveRequest::default_instance(), Prefix::kSessionRef},
    {"/polykv.v1.Session/Commit", v1::CommitRequest::default_instance(), Prefix::kSessionRef},
    {"/polykv.v1.Session/Sync", v1::SyncRequest::default_instance(), Prefix::kSessionRef},
    {"/polykv.v1.Session/Ack", v1::AckRequest::default_instance(), Prefix::kSessionRef},
    {"/polykv.v1.Session/Release", v1::ReleaseRequest::default_instance(), Prefix::kSessionRef},
    {"/polykv.v1.Session/CloseSession", v1::CloseSessionRequest::default_instance(),
     Prefix::kSessionRef},
    {"/polykv.v1.Session/Heartbeat", v1::HeartbeatRequest::default_instance(),
     Prefix::kSessionRef},
    {"/polykv.v1.Session/Watch", v1::WatchRequest::default_instance(), Prefix::kSessionRef},
    {"/polykv.v1.Session/ReportSlots", v1::ReportSlotsRequest::default_instance(),
     Prefix::kSessionRef},
    {"/polykv.v1.Admin/GetStats", v1::GetStatsRequest::default_instance(), Prefix::kNone},
    {"/polykv.v1.Admin/ListSessions", v1::ListSessionsRequest::default_instance(), Prefix::kNone},
    {"/polykv.v1.Admin/GetQos", v1::GetQosRequest::default_instance(), Prefix::kAgent},
    {"/polykv.v1.Admin/SetQos", v1::SetQosRequest::default_instance(), Prefix::kAgent},
    {"/polykv.v1.Admin/EvictSession", v1::EvictSessionRequest::default_instance(),
     Prefix::kSessionId},
    {"/polykv.v1.Session/AttachSession", v1::AttachSessionRequest::default_instance(),
     Prefix::kSessionRef},
    // This daemon has no peer TLS: refused before anything waits.
    {"/polykv.v1.Admin/MoveSession", v1::MoveSessionRequest::default_instance(),
     Prefix::kSessionId},
};
const Method kDrain{"/polykv.v1.Admin/Drain", v1::DrainRequest::default_instance(),
                    Prefix::kNone};
const Method kNoSuchMethod{"/polykv.v1.Session/NoSuchMethod",
                           v1::GetStatsRequest::default_instance(), Prefix::kNone};
constexpr const char* kAgent = "a";

void AppendVarint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(char(v | 0x80));
  out.push_back(char(v));
}

// Field 1 of the request, length-delimited (tag 0x0a) or a varint (0x08).
void AppendField1(std::string& out, const std::string& bytes) {
  out.push_back(0x0a);
  AppendVarint(out, bytes.size());
  out += bytes;
}

class Fixture {
 public:
  Fixture() {
    spdlog::set_level(spdlog::level::warn);  // an info line per Open/Close would drown the run
    char tmpl[] = "/tmp/polykv-fuzz-grpc-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Fail("mkdtemp");
    dir_ = tmpl;
    Start();
  }
  ~Fixture() {
    Stop();
    std::filesystem::remove_all(dir_);
  }

  // One input's calls, then the checks that the daemon is still whole.
  void RunInput(FuzzInput& in) {
    bool drained = false;
    for (int i = 0; i < kMaxCommands; ++i) {
      auto c = in.Next();
      if (!c) break;
      const Method& m = c->op == 255   ? kDrain
                        : c->op == 254 ? kNoSuchMethod
                                       : kMethods[c->op % std::size(kMethods)];
      Call(m, c->flags, c->payload);
      drained |= &m == &kDrain;
    }
    CloseOpened();
    CheckOk(daemon_->pool()->CheckInvariants(), "KvPool::CheckInvariants");
    if (drained || ++inputs_ >= kRestartEvery ||
        daemon_->pool()->num_sessions() > kMaxFuzzSessions) {
      Stop();
      Start();
      return;
    }
    StillServes();
  }

 private:
  void Start() {
    daemon::DaemonConfig c;
    c.socket = dir_ + "/polykvd.sock";
    c.socket_mode = 0600;
    c.metrics_address = "off";
    c.pool_bytes = 16u << 20;
    c.arena_bytes = 2u << 20;
    c.superblock_bytes = 64u << 10;
    c.lease_ms = 60000;  // the setup session outlives any run between restarts
    auto d = daemon::Daemon::Create(c);
    CheckOk(d.status(), "Daemon::Create");
    daemon_ = *std::move(d);
    CheckOk(daemon_->Start(), "Daemon::Start");
    channel_ = grpc::CreateChannel("unix:" + c.socket, grpc::InsecureChannelCredentials());
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
      Fail("cannot connect to the in-process daemon");
    }
    generic_ = std::make_unique<grpc::GenericStub>(channel_);
    session_ = v1::Session::NewStub(channel_);
    inputs_ = 0;
    OpenSetupSession();
  }

  void Stop() {
    session_.reset();
    generic_.reset();
    channel_.reset();
    daemon_.reset();
  }

  void OpenSetupSession() {
    v1::OpenSessionRequest r;
    r.set_agent_id(kAgent);
    r.set_tenant("t1");
    r.mutable_profile()->set_num_layers(2);
    r.mutable_profile()->set_num_kv_heads(2);
    r.mutable_profile()->set_head_dim(32);
    v1::OpenSessionResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status s = session_->OpenSession(&ctx, r, &resp);
    if (!s.ok()) Fail("the daemon no longer opens a session: " + s.error_message());
    ref_.set_session_id(resp.session_id());
    ref_.set_token(resp.token());
  }

  // The "normal request" after an input: the setup session's heartbeat, or
  // a new session when the input closed or evicted it.
  void CloseOpened() {
    for (const v1::SessionRef& ref : opened_) {
      v1::CloseSessionRequest r;
      *r.mutable_session() = ref;
      v1::CloseSessionResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      (void)session_->CloseSession(&ctx, r, &resp);  // NOT_FOUND when the input closed it
    }
    opened_.clear();
  }

  void StillServes() {
    v1::HeartbeatRequest r;
    *r.mutable_session() = ref_;
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status s = session_->Heartbeat(&ctx, r, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) return OpenSetupSession();
    if (!s.ok()) Fail("the daemon no longer answers a Heartbeat: " + s.error_message());
  }

  void Call(const Method& m, uint8_t flags, std::string_view payload) {
    std::string bytes;
    const v1::SessionRef& ref = (flags & 0x02) && !opened_.empty() ? opened_.back() : ref_;
    if (flags & 0x01) {
      switch (m.prefix) {
        case Prefix::kNone: break;
        case Prefix::kSessionRef: AppendField1(bytes, ref.SerializeAsString()); break;
        case Prefix::kSessionId:
          bytes.push_back(0x08);
          AppendVarint(bytes, ref.session_id());
          break;
        case Prefix::kAgent:
          if (&m.request == &v1::SetQosRequest::default_instance()) {
            v1::QosRecord q;
            q.set_agent_id(kAgent);
            AppendField1(bytes, q.SerializeAsString());
          } else {
            AppendField1(bytes, kAgent);
          }
          break;
      }
    }
    bytes.append(payload);
    grpc::Slice slice(bytes.data(), bytes.size());
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    // A Watch on a live session streams until cancelled: give it a moment.
    const bool watch = &m == &kMethods[8];
    ctx.set_deadline(std::chrono::system_clock::now() +
                     (watch ? std::chrono::milliseconds(5) : std::chrono::seconds(30)));
    std::promise<grpc::Status> done;
    generic_->UnaryCall(&ctx, m.name, grpc::StubOptions(), &request, &response,
                        [&done](grpc::Status s) { done.set_value(std::move(s)); });
    const grpc::Status s = done.get_future().get();
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !watch) {
      Fail(std::string(m.name) + ": no status within 30 s");
    }
    if (s.ok() && &m == &kMethods[0]) {
      v1::OpenSessionResponse resp;
      std::vector<grpc::Slice> slices;
      if (!response.Dump(&slices).ok()) Fail("OpenSession: unreadable response");
      std::string out;
      for (const grpc::Slice& sl : slices) {
        out.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      if (!resp.ParseFromString(out)) Fail("OpenSession: OK with a response that does not parse");
      v1::SessionRef& r = opened_.emplace_back();
      r.set_session_id(resp.session_id());
      r.set_token(resp.token());
    }
    std::unique_ptr<google::protobuf::Message> parsed(m.request.New());
    if (&m != &kNoSuchMethod && parsed->ParseFromString(bytes) &&
        daemon::IsUnexpected(static_cast<absl::StatusCode>(s.error_code()))) {
      Fail(std::string(m.name) + " answered a well-formed request with code " +
           std::to_string(s.error_code()) + ": " + s.error_message() + "\nrequest: " +
           parsed->ShortDebugString());
    }
  }

  std::string dir_;
  std::unique_ptr<daemon::Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> generic_;
  std::unique_ptr<v1::Session::Stub> session_;
  v1::SessionRef ref_;                  // the setup session
  std::vector<v1::SessionRef> opened_;  // by the input being run
  int inputs_ = 0;
};

}  // namespace
}  // namespace polykv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Built on the first input; destroyed at exit before gRPC's own statics
  // (constructed later, destroyed earlier), so the daemon stops cleanly.
  static polykv::fuzz::Fixture fixture;
  polykv::fuzz::FuzzInput in(data, size);
  fixture.RunInput(in);
  return 0;
}
