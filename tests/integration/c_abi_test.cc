// The C ABI (client/include/polykv/polykv_c.h) against a real polykvd.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "polykv/polykv_c.h"
#include "tests/integration/subprocess.h"

extern "C" int polykv_c_abi_reserve_one_block(pkv_session* session);

namespace polykv {
namespace {

using testing::BinDir;
using testing::Subprocess;

TEST(CAbiTest, SessionLifecycleAndErrors) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "polykv-cabi-", getpid());
  mkdir(dir.c_str(), 0700);
  const std::string sock = dir + "/d.sock";
  Subprocess daemon({BinDir() + "/polykvd", "--socket", sock, "--metrics-address", "off",
                     "--pool-bytes", "64MiB"});
  for (int i = 0; i < 500 && access(sock.c_str(), F_OK) != 0; ++i) usleep(20000);

  pkv_client* client = nullptr;
  ASSERT_EQ(pkv_connect(sock.c_str(), &client), 0) << pkv_last_error();
  pkv_session_options o{};
  o.agent_id = "c-agent";
  o.tenant = "c-tenant";
  o.num_layers = 2;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.dtype = PKV_DTYPE_F32;
  pkv_session* session = nullptr;
  ASSERT_EQ(pkv_session_open(client, &o, &session), 0) << pkv_last_error();
  EXPECT_GT(pkv_session_id(session), 0u);
  EXPECT_EQ(pkv_block_tokens(session), 16u);

  ASSERT_EQ(pkv_reserve(session, 20), 0) << pkv_last_error();
  ASSERT_EQ(polykv_c_abi_reserve_one_block(session), 0) << pkv_last_error();
  ASSERT_EQ(pkv_num_blocks(session), 3u);
  pkv_page pages[4];
  size_t n = 0;
  ASSERT_EQ(pkv_block_pages(session, 2, pages, 4, &n), 0) << pkv_last_error();
  ASSERT_EQ(n, 4u);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(pages[i].layer, i / 2);
    EXPECT_EQ(pages[i].is_value, i % 2);
    EXPECT_EQ(pages[i].block_index, 2u);
    EXPECT_EQ(pages[i].format, uint32_t{PKV_FORMAT_F32});  // the dtype's format
    ASSERT_NE(pages[i].addr, nullptr);
    std::memset(pages[i].addr, 0x5a, pages[i].size_bytes);  // the mapping is writable
  }
  EXPECT_EQ(pkv_commit(session, 40), 0) << pkv_last_error();

  // Errors: a code and a message, and nothing changes.
  EXPECT_EQ(pkv_commit(session, 1000), 3);  // INVALID_ARGUMENT: beyond the reserve
  EXPECT_NE(std::string(pkv_last_error()).find("reserved"), std::string::npos) << pkv_last_error();
  EXPECT_EQ(pkv_block_pages(session, 7, pages, 4, &n), 11);  // OUT_OF_RANGE
  EXPECT_EQ(pkv_session_open(client, nullptr, &session), 3);
  pkv_session_options bad = o;
  bad.num_layers = 0;
  pkv_session* none = nullptr;
  EXPECT_EQ(pkv_session_open(client, &bad, &none), 3);
  EXPECT_NE(std::string(pkv_last_error()).find("num_layers"), std::string::npos);
  EXPECT_EQ(none, nullptr);
  bad = o;
  bad.dtype = 0x101;  // would wrap to f32 in the C++ type
  EXPECT_EQ(pkv_session_open(client, &bad, &none), 3);
  EXPECT_NE(std::string(pkv_last_error()).find("dtype"), std::string::npos);
  bad = o;
  bad.key_format = PKV_FORMAT_INT2 + 1;
  EXPECT_EQ(pkv_session_open(client, &bad, &none), 3);
  EXPECT_NE(std::string(pkv_last_error()).find("key_format"), std::string::npos);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(pkv_num_blocks(session), 3u);

  EXPECT_EQ(pkv_release(session, 16), 0) << pkv_last_error();
  EXPECT_EQ(pkv_num_blocks(session), 1u);
  EXPECT_EQ(pkv_session_close(session), 0) << pkv_last_error();
  EXPECT_EQ(pkv_session_close(nullptr), 0);
  pkv_client_free(client);

  pkv_client* nobody = nullptr;
  EXPECT_EQ(pkv_connect((dir + "/missing.sock").c_str(), &nobody), 14);  // UNAVAILABLE
  EXPECT_EQ(nobody, nullptr);

  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0);
}

}  // namespace
}  // namespace polykv
