// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/),
// a few hand-made valid and invalid inputs each, or with --check compares
// the folder with what it would write (the fuzz_corpus_test).
//
//   polykv-fuzz-make-corpus [--check] tests/fuzz/corpus
//
// Request and gRPC inputs share the command numbering of ops 0..14 (see
// request_fuzzer.cc and grpc_fuzzer.cc), so most sequences seed both.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "polykv/v1/admin.pb.h"
#include "polykv/v1/peer.pb.h"
#include "polykv/v1/session.pb.h"
#include "proto/polykv/v1/fd_socket.h"

namespace polykv::fuzz {
namespace {

enum Op : uint8_t {
  kOpen, kReserve, kCommit, kSync, kAck, kRelease, kClose, kHeartbeat, kWatch, kReportSlots,
  kStats, kList, kGetQos, kSetQos, kEvict,
  // request_fuzzer only
  kDrain, kAdvance, kLadder, kDupArenaFd, kValidate, kExit, kImport, kAttach, kPark,
  // grpc_fuzzer only
  kGrpcNoSuchMethod = 254, kGrpcDrain = 255,
};
constexpr uint8_t kSetup = 0x03;  // the setup session's id and token (request), its ref (gRPC)

// One command of fuzz_input.h.
std::string Cmd(uint8_t op, uint8_t flags, const std::string& payload = "") {
  std::string out{char(op), char(flags), char(payload.size() & 0xff), char(payload.size() >> 8)};
  return out + payload;
}
std::string Cmd(uint8_t op, uint8_t flags, const google::protobuf::Message& m) {
  return Cmd(op, flags, m.SerializeAsString());
}
std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

v1::OpenSessionRequest Open(const std::string& agent, const std::string& tenant) {
  v1::OpenSessionRequest r;
  r.set_agent_id(agent);
  r.set_tenant(tenant);
  r.mutable_profile()->set_num_layers(2);
  r.mutable_profile()->set_num_kv_heads(2);
  r.mutable_profile()->set_head_dim(32);
  return r;
}
template <typename Req, typename Set>
Req With(Set set) {
  Req r;
  set(r);
  return r;
}
v1::ReserveRequest Reserve(uint32_t n) {
  return With<v1::ReserveRequest>([&](auto& r) { r.set_num_tokens(n); });
}
v1::CommitRequest Commit(uint64_t n) {
  return With<v1::CommitRequest>([&](auto& r) { r.set_committed_tokens(n); });
}
v1::SyncRequest Sync(uint64_t epoch) {
  return With<v1::SyncRequest>([&](auto& r) { r.set_known_epoch(epoch); });
}
v1::AckRequest Ack(uint64_t epoch) {
  return With<v1::AckRequest>([&](auto& r) { r.set_epoch(epoch); });
}
v1::ReleaseRequest Release(uint64_t keep) {
  return With<v1::ReleaseRequest>([&](auto& r) { r.set_keep_tokens(keep); });
}
v1::SetQosRequest Qos(const std::string& policy, uint64_t budget) {
  return With<v1::SetQosRequest>([&](auto& r) {
    r.mutable_qos()->set_agent_id("a");
    r.mutable_qos()->set_policy(policy);
    r.mutable_qos()->set_budget_tokens(budget);
  });
}
v1::ReportSlotsRequest Slots(uint64_t epoch, uint64_t first, int n, float attention) {
  return With<v1::ReportSlotsRequest>([&](auto& r) {
    r.set_epoch(epoch);
    r.set_first_slot(first);
    v1::ScoreValues* mass = r.add_scores();
    mass->set_stream(v1::SCORE_STREAM_ATTENTION);
    for (int i = 0; i < n; ++i) {
      v1::SlotMeta* m = r.add_slots();
      m->set_turn(uint32_t(i / 8));
      m->set_role(v1::Role(i % 4));
      m->set_tag_kind(v1::BlockKind(i % 3));
      m->set_block_id(uint32_t(i / 4));
      mass->add_values(attention * float(i % 5));
    }
  });
}

// Sequences valid for both request_fuzzer and grpc_fuzzer.
std::map<std::string, std::string> SessionSequences() {
  std::map<std::string, std::string> c;
  c["open_valid"] = Cmd(kOpen, 0, Open("x", "t3"));
  auto bad_profile = Open("x", "t3");
  bad_profile.mutable_profile()->set_num_layers(0);
  bad_profile.mutable_profile()->set_head_dim(2000);
  bad_profile.set_block_tokens(12);
  auto bad_enums = Open("x", "t3");
  bad_enums.mutable_profile()->set_dtype(v1::DType(99));
  bad_enums.set_key_format(v1::PageFormat(77));
  bad_enums.set_priority_hint(v1::PriorityClass(9));
  bad_enums.set_lease_ms(5);
  auto quantized = Open("x", "t3");
  quantized.set_key_format(v1::PAGE_FORMAT_INT4);
  quantized.set_value_format(v1::PAGE_FORMAT_INT2);
  quantized.mutable_profile()->set_head_dim(20);
  c["open_invalid"] = Cmd(kOpen, 0, Open("bad agent!", "")) +
                      Cmd(kOpen, 0, Open(std::string("\xff\xfe\x80", 3), "t")) +
                      Cmd(kOpen, 0, Open(std::string(200, 'a'), std::string(70, 't'))) +
                      Cmd(kOpen, 0, bad_profile) + Cmd(kOpen, 0, bad_enums) +
                      Cmd(kOpen, 0, quantized);
  c["reserve_commit_sync_ack"] =
      Cmd(kReserve, kSetup, Reserve(40)) + Cmd(kCommit, kSetup, Commit(40)) +
      Cmd(kSync, kSetup, Sync(0)) + Cmd(kAck, kSetup, Ack(0)) + Cmd(kHeartbeat, kSetup) +
      Cmd(kRelease, kSetup, Release(16)) + Cmd(kClose, kSetup);
  c["compaction_h2o"] =
      Cmd(kSetQos, 0x01, Qos("h2o", 16)) + Cmd(kReserve, kSetup, Reserve(64)) +
      Cmd(kCommit, kSetup, Commit(64)) + Cmd(kReportSlots, kSetup, Slots(0, 0, 64, 0.25f)) +
      Cmd(kSync, kSetup, Sync(0)) + Cmd(kSync, kSetup, Sync(1)) + Cmd(kAck, kSetup, Ack(1)) +
      Cmd(kReserve, kSetup, Reserve(32)) + Cmd(kCommit, kSetup, Commit(40)) +
      Cmd(kSync, kSetup, Sync(1)) + Cmd(kStats, 0) + Cmd(kList, 0);
  c["compaction_structural"] =
      Cmd(kSetQos, 0x01, Qos("sinks+structural+intent", 24)) +
      Cmd(kReserve, kSetup, Reserve(96)) + Cmd(kCommit, kSetup, Commit(96)) +
      Cmd(kReportSlots, kSetup, Slots(0, 8, 80, 1.5f)) + Cmd(kSync, kSetup, Sync(0)) +
      Cmd(kRelease, kSetup, Release(8)) + Cmd(kAck, kSetup, Ack(1)) + Cmd(kSync, kSetup, Sync(1));
  c["refusals"] = Cmd(kReserve, 0x01, Reserve(16)) + Cmd(kReserve, 0x07, Reserve(16)) +
                  Cmd(kReserve, 0, Reserve(16)) + Cmd(kReserve, kSetup, Reserve(0)) +
                  Cmd(kReserve, kSetup, Reserve(65537)) + Cmd(kReserve, kSetup, Reserve(65536)) +
                  Cmd(kCommit, kSetup, Commit(~uint64_t{0})) +
                  Cmd(kRelease, kSetup, Release(~uint64_t{0})) + Cmd(kSync, kSetup, Sync(99)) +
                  Cmd(kAck, kSetup, Ack(5)) + Cmd(kWatch, 0x07) + Cmd(kClose, 0x05);
  auto bad_slots = Slots(0, 0, 4, 1.0f);
  bad_slots.mutable_slots(1)->set_role(v1::Role(99));
  auto nan_slots = Slots(0, 0, 4, 1.0f);
  nan_slots.mutable_scores(0)->set_values(2, std::nanf(""));
  nan_slots.mutable_scores(0)->set_values(3, -1.0f);
  auto bad_streams = Slots(0, 0, 4, 1.0f);
  bad_streams.mutable_scores(0)->set_stream(v1::ScoreStream(99));  // unknown
  *bad_streams.add_scores() = bad_streams.scores(0);
  bad_streams.mutable_scores(1)->set_stream(v1::SCORE_STREAM_ENTROPY);  // not one per layer
  c["report_slots_invalid"] =
      Cmd(kReserve, kSetup, Reserve(16)) + Cmd(kCommit, kSetup, Commit(8)) +
      Cmd(kReportSlots, kSetup, bad_slots) + Cmd(kReportSlots, kSetup, nan_slots) +
      Cmd(kReportSlots, kSetup, bad_streams) +
      Cmd(kReportSlots, kSetup, Slots(0, ~uint64_t{0} - 1, 4, 1.0f)) +
      Cmd(kReportSlots, kSetup, Slots(3, 0, 4, 1.0f));
  auto bad_qos = Qos("h2o{window.size=", 0);
  bad_qos.mutable_qos()->set_guaranteed_bytes(100);
  bad_qos.mutable_qos()->set_max_bytes(10);
  c["admin"] = Cmd(kStats, 0) +
               Cmd(kList, 0, With<v1::ListSessionsRequest>([](auto& r) { r.set_tenant("t1"); })) +
               Cmd(kGetQos, 0, With<v1::GetQosRequest>([](auto& r) { r.set_agent_id("a"); })) +
               Cmd(kSetQos, 0, bad_qos) + Cmd(kSetQos, 0x01, Qos("nonsense", 0)) +
               Cmd(kEvict, 0x01, v1::EvictSessionRequest()) + Cmd(kEvict, 0x01) +
               Cmd(kHeartbeat, kSetup);
  c["garbage"] = Cmd(kReserve, kSetup, std::string("\x12\xff\xff\xff\xff\x0f", 6)) +
                 Cmd(kSync, 0, std::string("\x0a\x05\x08\x01", 4)) +
                 Cmd(kGetQos, 0, std::string("\x0a\x02\xc3\x28", 4));
  return c;
}

std::map<std::string, std::string> RequestCorpus() {
  auto c = SessionSequences();
  c["drain_reclaim_ladder"] =
      Cmd(kSetQos, 0x01, Qos("streaming", 8)) + Cmd(kReserve, kSetup, Reserve(4096)) +
      Cmd(kReserve, 0x13, Reserve(4096)) + Cmd(kLadder, 0) + Cmd(kAdvance, 0, U32(600)) +
      Cmd(kHeartbeat, kSetup) + Cmd(kAdvance, 0, U32(5000)) +
      Cmd(kDrain, 0, With<v1::DrainRequest>([](auto& r) { r.set_evict_after_ms(10); })) +
      Cmd(kOpen, 0, Open("y", "t1")) + Cmd(kAdvance, 0, U32(20)) + Cmd(kStats, 0);
  c["arena_fd"] = Cmd(kReserve, kSetup, Reserve(16)) + Cmd(kDupArenaFd, kSetup, U32(1)) +
                  Cmd(kDupArenaFd, 0x17, U32(1)) + Cmd(kDupArenaFd, kSetup, U32(999));
  v1::ModelProfile p;
  p.set_num_layers(1025);
  c["validation"] = Cmd(kValidate, 0, "ok_name:1.2-3") + Cmd(kValidate, 0, "bad name\x01") +
                    Cmd(kValidate, 0, U32(16)) + Cmd(kValidate, 0, p.SerializeAsString());
  c["quarantine"] = Cmd(kReserve, kSetup, Reserve(64)) + Cmd(kEvict, 0x01) +
                    Cmd(kStats, 0) + Cmd(kReserve, kSetup, Reserve(16)) +
                    Cmd(kReserve, 0x13, Reserve(64)) + Cmd(kDupArenaFd, 0x13, U32(2)) +
                    Cmd(kEvict, 0x11) + Cmd(kExit, 0x10) + Cmd(kAdvance, 0, U32(2000)) +
                    Cmd(kOpen, 0, Open("z", "t2")) + Cmd(kReserve, 0x23, Reserve(128));
  // A session as a peer daemon sends it: 2 blocks of 16 f16 tokens, 20
  // committed, in the setup sessions' profile.
  v1::MovedSession moved;
  moved.set_agent_id("m");
  moved.set_tenant("t1");
  *moved.mutable_profile() = Open("m", "t1").profile();
  moved.set_block_tokens(16);
  moved.set_key_format(v1::PAGE_FORMAT_F16);
  moved.set_value_format(v1::PAGE_FORMAT_F16);
  moved.set_priority(v1::PRIORITY_NORMAL);
  moved.set_committed_tokens(20);
  for (int b = 0; b < 2; ++b) {
    v1::MovedBlock* mb = moved.add_blocks();
    mb->set_key_format(v1::PAGE_FORMAT_F16);
    mb->set_value_format(v1::PAGE_FORMAT_F16);
  }
  v1::MovedRecords* rec = moved.add_records();
  for (int i = 0; i < 20; ++i) {
    rec->add_positions(i);
    rec->add_counts(1);
    rec->add_meta()->set_turn(0);
  }
  moved.set_next_position(20);
  c["import"] = Cmd(kImport, 0x08, moved) + Cmd(kImport, 0, moved) + Cmd(kList, 0) +
                Cmd(kPark, kSetup) + Cmd(kReserve, kSetup, Reserve(16)) +
                Cmd(kAttach, 0x23, v1::AttachSessionRequest()) + Cmd(kSync, 0x23, v1::SyncRequest()) +
                Cmd(kAttach, 0x27, v1::AttachSessionRequest());
  c["second_session"] = Cmd(kOpen, 0x04, Open("c", "t1")) + Cmd(kReserve, 0x23, Reserve(16)) +
                        Cmd(kReserve, 0x13, Reserve(16)) + Cmd(kClose, 0x13) +
                        Cmd(kList, 0) + Cmd(kEvict, 0x21);
  return c;
}

std::map<std::string, std::string> GrpcCorpus() {
  auto c = SessionSequences();
  c["drain"] = Cmd(kGrpcDrain, 0, With<v1::DrainRequest>([](auto& r) { r.set_evict_after_ms(1); }));
  c["no_such_method"] = Cmd(kGrpcNoSuchMethod, 0, "\x08\x01");
  c["watch"] = Cmd(kWatch, kSetup) + Cmd(kSetQos, 0x01, Qos("full", 0));
  return c;
}

std::string Bytes(const v1::FdRequest& r) {
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

std::map<std::string, std::string> FdWireCorpus() {
  v1::FdRequest ok;
  ok.session_id = (uint64_t{1} << 32) | 1;
  ok.arena_id = 1;
  std::memset(ok.token, 0x5a, sizeof(ok.token));
  v1::FdRequest bad_magic = ok, bad_version = ok;
  bad_magic.magic = 0;
  bad_version.version = 2;
  return {{"valid", Bytes(ok)},
          {"short", Bytes(ok).substr(0, 8)},
          {"long", Bytes(ok) + "x"},
          {"bad_magic", Bytes(bad_magic)},
          {"bad_version", Bytes(bad_version)}};
}

// [flags][chunk][request]: see fd_broker_fuzzer.cc.
std::map<std::string, std::string> FdBrokerCorpus() {
  v1::FdRequest r;
  const std::string req = Bytes(r);
  return {{"fetch", std::string("\x0f\x00", 2) + req},
          {"fetch_in_chunks", std::string("\x0f\x07", 2) + req},
          {"wrong_arena", std::string("\x07\x00", 2) + req},
          {"wrong_token", std::string("\x0b\x01", 2) + req},
          {"unknown_session", std::string("\x01\x00", 2) + req},
          {"bad_header", std::string("\x0e\x00", 2) + std::string(56, '\x11')},
          {"short", std::string("\x0f\x03", 2) + req.substr(0, 10)},
          {"long", std::string("\x0f\x10", 2) + req + std::string(44, 'z')},
          {"empty", std::string("\x00\x00", 2)}};
}

}  // namespace
}  // namespace polykv::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const bool check = argc == 3 && std::string(argv[1]) == "--check";
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: %s [--check] CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[argc - 1];
  const std::map<std::string, std::map<std::string, std::string>> corpora = {
      {"request_fuzzer", polykv::fuzz::RequestCorpus()},
      {"grpc_fuzzer", polykv::fuzz::GrpcCorpus()},
      {"fd_wire_fuzzer", polykv::fuzz::FdWireCorpus()},
      {"fd_broker_fuzzer", polykv::fuzz::FdBrokerCorpus()}};
  int stale = 0;
  for (const auto& [target, files] : corpora) {
    if (!check) fs::create_directories(root / target);
    for (const auto& [name, bytes] : files) {
      const fs::path p = root / target / name;
      if (check) {
        std::ifstream in(p, std::ios::binary);
        const std::string got{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
        if (!in.is_open() || got != bytes) {
          std::fprintf(stderr, "%s is missing or stale\n", p.c_str());
          ++stale;
        }
      } else {
        std::ofstream(p, std::ios::binary) << bytes;
      }
    }
  }
  if (stale > 0) {
    std::fprintf(stderr, "run: polykv-fuzz-make-corpus tests/fuzz/corpus\n");
    return 1;
  }
  return 0;
}
