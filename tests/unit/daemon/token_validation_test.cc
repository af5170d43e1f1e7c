#include <gtest/gtest.h>

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/pool/token.h"
#include "daemon/pool/validation.h"
#include "daemon/rpc/convert.h"
#include "daemon/rpc/peer_registry.h"

namespace polykv::daemon {
namespace {

TEST(TokenTest, TokensAreLongAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    auto t = NewToken();
    ASSERT_TRUE(t.ok());
    ASSERT_EQ(t->size(), kTokenBytes);
    EXPECT_TRUE(seen.insert(*t).second);
  }
}

TEST(TokenTest, EqualityNeedsEveryByteAndTheLength) {
  std::string a(32, 'x');
  EXPECT_TRUE(TokenEquals(a, a));
  for (size_t i = 0; i < a.size(); ++i) {
    std::string b = a;
    b[i] ^= 0x40;
    EXPECT_FALSE(TokenEquals(a, b)) << i;
  }
  EXPECT_FALSE(TokenEquals(a, a.substr(0, 31)));
  EXPECT_FALSE(TokenEquals(a, ""));
}

TEST(ValidationTest, NamesAreBoundedAndPlain) {
  EXPECT_TRUE(ValidateName("agent_id", "coder-1.v2:x_y", 128).ok());
  EXPECT_FALSE(ValidateName("agent_id", "", 128).ok());
  EXPECT_FALSE(ValidateName("agent_id", std::string(129, 'a'), 128).ok());
  for (const char* bad : {"a b", "a/b", "a\nb", "ä", "a;rm"}) {
    auto s = ValidateName("tenant", bad, 64);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_NE(s.message().find("tenant"), absl::string_view::npos);
  }
}

TEST(ValidationTest, ProfilesAndBlockSizes) {
  EXPECT_TRUE(ValidateProfile({30, 3, 64, DType::kF32, "smollm2"}).ok());
  EXPECT_FALSE(ValidateProfile({0, 3, 64, DType::kF32, ""}).ok());
  EXPECT_FALSE(ValidateProfile({30, 0, 64, DType::kF32, ""}).ok());
  EXPECT_FALSE(ValidateProfile({30, 3, 2048, DType::kF32, ""}).ok());
  for (uint32_t ok : {1u, 2u, 16u, 256u}) EXPECT_TRUE(ValidateBlockTokens(ok).ok()) << ok;
  for (uint32_t bad : {0u, 3u, 24u, 512u}) EXPECT_FALSE(ValidateBlockTokens(bad).ok()) << bad;
}

TEST(ConvertTest, UnknownEnumValuesAreRefused) {
  v1::OpenSessionRequest r;
  r.set_key_format(static_cast<v1::PageFormat>(42));
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(r, PeerCreds{}).status()));
  r.set_key_format(v1::PAGE_FORMAT_INT4);
  r.mutable_profile()->set_dtype(static_cast<v1::DType>(9));
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(r, PeerCreds{}).status()));
  v1::QosRecord q;
  q.set_priority(static_cast<v1::PriorityClass>(77));
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(q).status()));
}

// Every stream of the table is on the wire at its WireValue, named after it
// (so a new stream needs its proto value, and nothing in convert.cc).
TEST(ConvertTest, EveryScoreStreamIsOnTheWireUnderItsName) {
  for (policies::ScoreStream s : policies::AllScoreStreams()) {
    const int wire = policies::WireValue(s);
    ASSERT_TRUE(v1::ScoreStream_IsValid(wire)) << policies::ScoreStreamName(s);
    EXPECT_EQ(v1::ScoreStream_Name(static_cast<v1::ScoreStream>(wire)),
              absl::StrCat("SCORE_STREAM_",
                           absl::AsciiStrToUpper(std::string(policies::ScoreStreamName(s)))));
  }
}

TEST(ConvertTest, SlotMetaKeepsItsValuesAndRefusesOutOfRange) {
  v1::ReportSlotsRequest r;
  r.set_first_slot(4);
  v1::SlotMeta* m = r.add_slots();
  m->set_turn(3);
  m->set_role(v1::ROLE_TOOL_OUTPUT);
  m->set_tag_kind(v1::BLOCK_KIND_ERROR);
  m->set_block_id(9);
  m->set_tag_depth(2);
  m->set_tag_boundary(true);
  m->set_pinned(true);
  auto ok = FromProto(r);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->slots.size(), 1u);
  const policies::SlotMeta& s = ok->slots[0];
  EXPECT_EQ(s.turn, 3);
  EXPECT_EQ(s.role, policies::Role::kToolOutput);
  EXPECT_EQ(s.tag.kind, policies::BlockKind::kError);
  EXPECT_EQ(s.tag.block_id, 9u);
  EXPECT_EQ(s.tag.depth, 2);
  EXPECT_TRUE(s.tag.boundary);
  EXPECT_TRUE(s.pinned);
  // Proto3 enums are open: unnamed numbers arrive and must be refused.
  for (int role : {-1, policies::kNumRoles}) {
    v1::ReportSlotsRequest bad = r;
    bad.mutable_slots(0)->set_role(static_cast<v1::Role>(role));
    EXPECT_TRUE(absl::IsInvalidArgument(FromProto(bad).status())) << role;
  }
  for (int kind : {-1, policies::kNumBlockKinds}) {
    v1::ReportSlotsRequest bad = r;
    bad.mutable_slots(0)->set_tag_kind(static_cast<v1::BlockKind>(kind));
    EXPECT_TRUE(absl::IsInvalidArgument(FromProto(bad).status())) << kind;
  }
  v1::ReportSlotsRequest bad = r;
  bad.mutable_slots(0)->set_turn(uint32_t{INT32_MAX} + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(bad).status()));
  bad = r;
  bad.mutable_slots(0)->set_tag_depth(UINT16_MAX + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(bad).status()));
}

TEST(PeerRegistryTest, OnlyAcceptedFdPeersResolve) {
  PeerRegistry r;
  r.Add(7, 1, PeerCreds{100, 1000, 1000});
  auto p = r.Lookup("fd:7");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->uid, 1000u);
  EXPECT_FALSE(r.Lookup("fd:8").has_value());
  EXPECT_FALSE(r.Lookup("unix:/tmp/x").has_value());
  EXPECT_FALSE(r.Lookup("fd:7x").has_value());
  r.Add(7, 2, PeerCreds{101, 2000, 2000});  // fd number reused by a later accept
  EXPECT_EQ(r.Lookup("fd:7")->uid, 2000u);
  r.Remove(7, 1);  // the old connection's late removal keeps the new entry
  EXPECT_EQ(r.Lookup("fd:7")->uid, 2000u);
  r.Remove(7, 2);
  EXPECT_FALSE(r.Lookup("fd:7").has_value());
  EXPECT_EQ(r.size(), 0u);
}

}  // namespace
}  // namespace polykv::daemon
