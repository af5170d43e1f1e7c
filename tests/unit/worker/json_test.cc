#include "client/worker/json.h"

#include "gtest/gtest.h"

namespace polykv::worker {
namespace {

TEST(JsonTest, ParsesScriptLines) {
  auto v = ParseJson(R"({"role": "user", "content": "a\"b\n\u00e9\ud83d\ude00", "n": -2.5e1,
                         "ok": true, "x": null, "arr": [1, {"k": []}]})");
  ASSERT_TRUE(v.ok()) << v.status();
  const auto& o = v->obj();
  EXPECT_EQ(o.at("role").str(), "user");
  EXPECT_EQ(o.at("content").str(), "a\"b\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(o.at("n").num(), -25.0);
  EXPECT_TRUE(std::get<bool>(o.at("ok").v));
}

TEST(JsonTest, RejectsMalformedInput) {
  for (const char* bad : {"", "{", "{\"a\" 1}", "{\"a\": }", "[1,]", "\"\\ud800\"", "tru",
                          "{\"a\": 1} x", "\"a\x01\""}) {
    EXPECT_FALSE(ParseJson(bad).ok()) << bad;
  }
}

TEST(JsonTest, QuoteRoundTrips) {
  const std::string s = "q\"\\\n\t\x01 \xC3\xA9 end";
  auto v = ParseJson(JsonQuote(s));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->str(), s);
  // Invalid UTF-8 is replaced, so the output line stays valid.
  EXPECT_EQ(JsonQuote("a\xFF"), "\"a\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace polykv::worker
