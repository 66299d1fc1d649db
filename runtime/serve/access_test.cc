#include "runtime/serve/access.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace serve {
namespace {

using Strings = std::vector<std::string>;

std::string Get(const Headers& headers, const std::string& name) {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "<absent>";
}

TEST(ParseListFlagTest, JsonListOrCommaList) {
  EXPECT_EQ(*ParseListFlag("allowed-origins", R"(["*"])"), Strings{"*"});
  EXPECT_EQ(*ParseListFlag("allowed-origins",
                           R"( ["http://a.test", " http://b.test ", ""] )"),
            (Strings{"http://a.test", "http://b.test"}));
  EXPECT_EQ(*ParseListFlag("allowed-origins", "http://a.test, http://b.test,"),
            (Strings{"http://a.test", "http://b.test"}));
  EXPECT_EQ(*ParseListFlag("allowed-origins", "*"), Strings{"*"});
  EXPECT_EQ(*ParseListFlag("allowed-origins", ""), Strings{});
  for (const char* bad : {"[1]", "[\"a\"", "[[\"a\"]]", "[\"a\", null]"}) {
    const auto r = ParseListFlag("allowed-origins", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--allowed-origins"),
              std::string::npos);
  }
}

TEST(ApiKeyTest, BearerWithTheExactKeyOnly) {
  EXPECT_TRUE(ApiKeyMatches("Bearer sk-123", "sk-123"));
  EXPECT_TRUE(ApiKeyMatches("bearer sk-123", "sk-123"));
  EXPECT_TRUE(ApiKeyMatches("BEARER   sk-123", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("Bearer sk-124", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("Bearer sk-12", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("Bearer sk-1234", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("Bearer ", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("sk-123", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("Basic sk-123", "sk-123"));
  EXPECT_FALSE(ApiKeyMatches("Bearer", "sk-123"));
  // A NUL inside does not end the comparison.
  // (Split literals: "\0" followed by a digit would be an octal escape.)
  EXPECT_FALSE(ApiKeyMatches(std::string("Bearer sk-\0"
                                         "123",
                                         14),
                             "sk-123"));
  EXPECT_FALSE(ApiKeyMatches(std::string("Bearer sk-123\0", 14), "sk-123"));
  // No key configured matches nothing (the server does not check then).
  EXPECT_FALSE(ApiKeyMatches("Bearer ", ""));
}

TEST(ApiKeyTest, GuardedRoutes) {
  for (const char* p :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/x",
        "/v1", "/tokenize", "/detokenize", "/v1/nope"}) {
    EXPECT_TRUE(NeedsApiKey(p)) << p;
  }
  for (const char* p : {"/health", "/metrics", "/version", "/", "/v10",
                        "/tokenizer", "/nope"}) {
    EXPECT_FALSE(NeedsApiKey(p)) << p;
  }
}

TEST(ApiKeyTest, UnauthorizedBodyIsOpenAiShaped) {
  for (bool given : {false, true}) {
    const auto body = nlohmann::json::parse(UnauthorizedBody(given));
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["code"], "invalid_api_key");
    EXPECT_TRUE(body["error"]["param"].is_null());
    EXPECT_TRUE(body["error"]["message"].is_string());
  }
  EXPECT_NE(UnauthorizedBody(true), UnauthorizedBody(false));
}

TEST(CorsTest, OffWithoutOrigins) {
  CorsPolicy cors(CorsOptions{});
  EXPECT_FALSE(cors.enabled());
  EXPECT_FALSE(cors.IsPreflight("OPTIONS", "http://a.test", "POST"));
  EXPECT_TRUE(cors.SimpleHeaders("http://a.test", false).empty());
}

TEST(CorsTest, AnyOriginAsVllmDefaults) {
  CorsPolicy cors(CorsOptions{.allowed_origins = {"*"}});
  EXPECT_TRUE(cors.IsPreflight("OPTIONS", "http://a.test", "POST"));
  EXPECT_FALSE(cors.IsPreflight("OPTIONS", "", "POST"));
  EXPECT_FALSE(cors.IsPreflight("OPTIONS", "http://a.test", ""));
  EXPECT_FALSE(cors.IsPreflight("POST", "http://a.test", "POST"));
  const CorsPolicy::Preflight p = cors.AnswerPreflight(
      "http://a.test", "POST", "authorization, content-type");
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.body, "OK");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Methods"),
            "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Headers"),
            "authorization, content-type");  // Mirrored.
  EXPECT_EQ(Get(p.headers, "Access-Control-Max-Age"), "600");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Credentials"), "<absent>");
  EXPECT_EQ(Get(p.headers, "Vary"), "<absent>");
  const Headers simple = cors.SimpleHeaders("http://a.test", false);
  EXPECT_EQ(Get(simple, "Access-Control-Allow-Origin"), "*");
  // With cookies: the origin itself.
  const Headers cookie = cors.SimpleHeaders("http://a.test", true);
  EXPECT_EQ(Get(cookie, "Access-Control-Allow-Origin"), "http://a.test");
  EXPECT_EQ(Get(cookie, "Vary"), "Origin");
  // No Origin header: not a CORS request.
  EXPECT_TRUE(cors.SimpleHeaders("", false).empty());
}

TEST(CorsTest, ListedOriginsMethodsHeadersAndCredentials) {
  CorsPolicy cors(CorsOptions{.allowed_origins = {"http://a.test"},
                              .allowed_methods = {"get", "POST"},
                              .allowed_headers = {"Authorization"},
                              .allow_credentials = true});
  CorsPolicy::Preflight p =
      cors.AnswerPreflight("http://a.test", "POST", "Authorization");
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Origin"), "http://a.test");
  EXPECT_EQ(Get(p.headers, "Vary"), "Origin");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Headers"),
            "accept, accept-language, authorization, content-language, "
            "content-type");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Credentials"), "true");
  // Another origin, method or header: 400 naming what was refused.
  p = cors.AnswerPreflight("http://evil.test", "DELETE", "X-Custom");
  EXPECT_EQ(p.status, 400);
  EXPECT_EQ(p.body, "Disallowed CORS origin, method, headers");
  EXPECT_EQ(Get(p.headers, "Access-Control-Allow-Origin"), "<absent>");
  EXPECT_EQ(
      cors.AnswerPreflight("http://a.test", "POST", "content-type").status,
      200);  // Safelisted.
  EXPECT_EQ(cors.AnswerPreflight("http://a.test", "PUT", "").body,
            "Disallowed CORS method");
  const Headers simple = cors.SimpleHeaders("http://a.test", false);
  EXPECT_EQ(Get(simple, "Access-Control-Allow-Origin"), "http://a.test");
  EXPECT_EQ(Get(simple, "Access-Control-Allow-Credentials"), "true");
  EXPECT_TRUE(cors.SimpleHeaders("http://evil.test", false).empty());
}

TEST(AccessLogTest, OneLineWithTokensWhenKnown) {
  AccessLogEntry e;
  e.remote_addr = "127.0.0.1";
  e.remote_port = 54321;
  e.method = "POST";
  e.path = "/v1/completions";
  e.status = 200;
  e.seconds = 0.1534;
  e.prompt_tokens = 5;
  e.generation_tokens = 16;
  EXPECT_EQ(AccessLogLine(e),
            "[tessera] access: 127.0.0.1:54321 \"POST /v1/completions\" 200 "
            "0.153s prompt_tokens=5 generation_tokens=16");
  e.prompt_tokens.reset();
  e.generation_tokens.reset();
  e.remote_addr = "::1";
  e.method = "GET";
  e.path = "/health";
  e.status = 503;
  EXPECT_EQ(AccessLogLine(e),
            "[tessera] access: [::1]:54321 \"GET /health\" 503 0.153s");
}

TEST(AccessLogTest, ClientBytesCannotForgeLines) {
  AccessLogEntry e;
  e.remote_addr = "10.0.0.1";
  e.method = "GET\n";
  e.path = "/x\n[tessera] access: \"forged\"\xff";
  const std::string line = AccessLogLine(e);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("/x\\x0a[tessera] access: \\x22forged\\x22\\xff"),
            std::string::npos)
      << line;
  e.path = "/" + std::string(1000, 'a');
  const std::string cut = AccessLogLine(e);
  EXPECT_LT(cut.size(), 300u);
  EXPECT_NE(cut.find("aaa...\""), std::string::npos) << cut;
}

}  // namespace
}  // namespace serve
}  // namespace tessera
