#include "client/worker/json.h"

#include "gtest/gtest.h"

namespace polykv::worker {
namespace {

TEST(JsonTest, ParsesScriptLines) {
  auto v = ParseJson(R"({"role": "user", "content": "a\"b\n\u00e9\ud83d\ude00", "n": -2.5e1,
                         "ok": true, "x": null, "arr": [1, {"k": []}]})");
  ASSERT_TRUE(v.ok()) << v.status();
  const auto& o = *v;
  EXPECT_EQ(o.at("role").get_ref<const std::string&>(), "user");
  EXPECT_EQ(o.at("content").get_ref<const std::string&>(), "a\"b\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(o.at("n").get<double>(), -25.0);
  EXPECT_TRUE(o.at("ok").get<bool>());
}

TEST(JsonTest, RejectsMalformedInput) {
  for (const char* bad : {"", "{", "{\"a\" 1}", "{\"a\": }", "[1,]", "\"\\ud800\"", "tru",
                          "{\"a\": 1} x", "\"a\x01\"",
                          "1e999" /* Python reads Infinity; nlohmann refuses the overflow */}) {
    EXPECT_FALSE(ParseJson(bad).ok()) << bad;
  }
}

TEST(JsonTest, QuoteRoundTrips) {
  const std::string s = "q\"\\\n\t\x01 \xC3\xA9 end";
  auto v = ParseJson(JsonQuote(s));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->get_ref<const std::string&>(), s);
  // Invalid UTF-8 is replaced, so the output line stays valid.
  EXPECT_EQ(JsonQuote("a\xFF"), "\"a\xEF\xBF\xBD\"");
}

TEST(JsonTest, ObjectsKeepDocumentOrder) {
  auto v = ParseJson(R"({"z": 1, "a": 2, "z": 3})");
  ASSERT_TRUE(v.ok()) << v.status();
  std::string keys;
  for (const auto& [k, val] : v->items()) keys += k;
  EXPECT_EQ(keys, "za");  // A repeated key keeps its place, takes the last value (as Python).
  EXPECT_EQ((*v).at("z").get<double>(), 3.0);
}

TEST(JsonTest, PythonJsonDumps) {
  // Expected strings from Python: json.dumps(json.loads(text), ensure_ascii=False).
  const std::pair<const char*, const char*> cases[] = {
      {R"({"b":[1,2.0,-0,-0.0,1e16,1e15,0.0001,1e-5,3e-7,2.50,12345678901234567890]})",
       R"({"b": [1, 2.0, 0, -0.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, 3e-07, 2.5, 12345678901234567890]})"},
      {R"({"s":"q\"\\\/\b\f\n\r\t\u0001\u007f\u00e9\u2028","t":true,"n":null,"e":{},"a":[]})",
       "{\"s\": \"q\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\x7f\xC3\xA9\xE2\x80\xA8\", \"t\": true, "
       "\"n\": null, \"e\": {}, \"a\": []}"},
  };
  for (const auto& [in, want] : cases) {
    auto v = ParseJson(in);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(PythonJsonDumps(*v), want) << in;
  }
}

}  // namespace
}  // namespace polykv::worker
