#include "daemon/rpc/fd_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "proto/polykv/v1/fd_socket.h"

namespace polykv::daemon {
namespace {

std::string Bytes(const v1::FdRequest& r) {
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

v1::FdRequest Valid() {
  v1::FdRequest r;
  r.session_id = 0x0123456789abcdefull;
  for (size_t i = 0; i < sizeof(r.token); ++i) r.token[i] = static_cast<uint8_t>(i * 7);
  r.arena_id = 42;
  return r;
}

TEST(FdWireTest, AWellFormedRequestGivesBackItsFields) {
  const v1::FdRequest sent = Valid();
  auto r = ParseFdRequest(Bytes(sent));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->session_id, sent.session_id);
  EXPECT_EQ(r->arena_id, 42u);
  ASSERT_EQ(r->token.size(), sizeof(sent.token));
  EXPECT_EQ(std::memcmp(r->token.data(), sent.token, sizeof(sent.token)), 0);
}

TEST(FdWireTest, ShortAndLongRequestsAreInvalidArguments) {
  const std::string ok = Bytes(Valid());
  for (size_t n : {size_t{0}, size_t{8}, ok.size() - 1}) {
    auto r = ParseFdRequest(ok.substr(0, n));
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << n << ": " << r.status();
  }
  auto r = ParseFdRequest(ok + "x");
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("57 bytes"), absl::string_view::npos) << r.status();
}

TEST(FdWireTest, WrongMagicOrVersionIsInvalidArgumentNamingBoth) {
  v1::FdRequest bad = Valid();
  bad.magic = 7;
  auto r = ParseFdRequest(Bytes(bad));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("magic/version 7/1"), absl::string_view::npos) << r.status();
  bad = Valid();
  bad.version = v1::kFdVersion + 1;
  EXPECT_TRUE(absl::IsInvalidArgument(ParseFdRequest(Bytes(bad)).status()));
}

}  // namespace
}  // namespace polykv::daemon
