// The one internal-to-gRPC translation: refusals pass through, bugs are logged
// once on the server (rate-limited) and reach the client as a clean message.
#include "daemon/rpc/status_map.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

namespace polykv::daemon {
namespace {

struct Captured {
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> logger;
  Captured() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    sink->set_pattern("%v");
    logger = std::make_shared<spdlog::logger>("status_map_test", sink);
  }
  int Lines() const {
    const std::string s = out.str();
    return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
  }
};

TEST(StatusMapTest, RefusalsPassTheirMessageThrough) {
  Captured c;
  ErrorLog log({.logger = c.logger});
  const grpc::Status s =
      ToGrpc(absl::ResourceExhaustedError("pool full: 10 of 10 bytes"), "Reserve", &log);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "pool full: 10 of 10 bytes");
  EXPECT_TRUE(ToGrpc(absl::OkStatus(), "Reserve", &log).ok());
  EXPECT_EQ(c.Lines(), 0);  // Low layers' refusals are the client's to read, not the log's.
}

TEST(StatusMapTest, InternalErrorsAreLoggedWithDetailAndCleanForTheClient) {
  Captured c;
  ErrorLog log({.logger = c.logger});
  const grpc::Status s =
      ToGrpc(absl::InternalError("page 17 freed twice (refcount -1)"), "CloseSession", &log);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(s.error_message(),
            "internal error in polykvd (rpc CloseSession, incident 1); the daemon's log has the detail");
  EXPECT_EQ(s.error_message().find("page 17"), std::string::npos);
  EXPECT_EQ(c.Lines(), 1);
  EXPECT_NE(c.out.str().find("rpc CloseSession failed, incident 1: INTERNAL: page 17 freed twice"),
            std::string::npos)
      << c.out.str();
  EXPECT_EQ(ToGrpc(absl::DataLossError("x"), "A", &log).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ToGrpc(absl::UnknownError("y"), "A", nullptr).error_message(),
            "internal error in polykvd (rpc A); the daemon's log has the detail");
}

TEST(StatusMapTest, AFloodIsRateLimitedAndCounted) {
  Captured c;
  ErrorLog log({.logger = c.logger, .max_lines = 3, .window = absl::Seconds(10)});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 100; ++i) log.Record("Reserve", absl::InternalError("bug"), t0 + absl::Milliseconds(i));
  EXPECT_EQ(c.Lines(), 3);
  // The next window logs again and says what it left out.
  EXPECT_EQ(log.Record("Reserve", absl::InternalError("bug"), t0 + absl::Seconds(11)), 101u);
  EXPECT_EQ(c.Lines(), 4);
  EXPECT_NE(c.out.str().find("incident 101: INTERNAL: bug (97 earlier errors not logged"),
            std::string::npos)
      << c.out.str();
}

}  // namespace
}  // namespace polykv::daemon
