#include <doctest/doctest.h>

#include "lib/upstream/www_authenticate.h"

namespace shoal::upstream {
TEST_SUITE_BEGIN("upstream");

TEST_CASE("www-authenticate: parses Docker Hub's bearer challenge") {
  auto r = ParseWwwAuthenticate(
      R"(Bearer realm="https://auth.docker.io/token",service="registry.docker.io",)"
      R"(scope="repository:library/alpine:pull")");
  REQUIRE(r.has_value());
  REQUIRE(r.value().size() == 1);
  const Challenge& c = r.value()[0];
  CHECK(c.scheme == "bearer");
  CHECK(c.params.at("realm") == "https://auth.docker.io/token");
  CHECK(c.params.at("service") == "registry.docker.io");
  CHECK(c.params.at("scope") == "repository:library/alpine:pull");
}

TEST_CASE("www-authenticate: parses gcr.io and Artifact Registry challenges") {
  auto gcr = ParseWwwAuthenticate(
      R"(Bearer realm="https://gcr.io/v2/token",service="gcr.io",scope="repository:p/i:pull")");
  REQUIRE(gcr.has_value());
  CHECK(gcr.value()[0].params.at("service") == "gcr.io");
  // Artifact Registry omits service.
  auto ar = ParseWwwAuthenticate(R"(Bearer realm="https://us-docker.pkg.dev/v2/token",)"
                                 R"(scope="repository:p/r/i:pull")");
  REQUIRE(ar.has_value());
  CHECK(ar.value()[0].params.count("service") == 0);
  CHECK(ar.value()[0].params.at("realm") == "https://us-docker.pkg.dev/v2/token");
}

TEST_CASE("www-authenticate: lowercases scheme and parameter names, keeps values") {
  auto r = ParseWwwAuthenticate(R"(BASIC Realm="Registry Realm", Charset=UTF-8)");
  REQUIRE(r.has_value());
  CHECK(r.value()[0].scheme == "basic");
  CHECK(r.value()[0].params.at("realm") == "Registry Realm");
  CHECK(r.value()[0].params.at("charset") == "UTF-8");
}

TEST_CASE("www-authenticate: unescapes quoted strings") {
  auto r = ParseWwwAuthenticate(R"(Bearer realm="a\"b\\c\d", error="invalid_token")");
  REQUIRE(r.has_value());
  CHECK(r.value()[0].params.at("realm") == "a\"b\\cd");
  CHECK(r.value()[0].params.at("error") == "invalid_token");
}

TEST_CASE("www-authenticate: splits several challenges in one header") {
  auto r = ParseWwwAuthenticate(
      R"(Basic realm="basic, realm", Bearer realm="https://t/token", service = "s" ,)"
      R"( Negotiate, NTLM abc123==, Bearer error="x")");
  REQUIRE(r.has_value());
  REQUIRE(r.value().size() == 5);
  CHECK(r.value()[0].scheme == "basic");
  CHECK(r.value()[0].params.at("realm") == "basic, realm");
  CHECK(r.value()[1].scheme == "bearer");
  CHECK(r.value()[1].params.at("realm") == "https://t/token");
  CHECK(r.value()[1].params.at("service") == "s");
  CHECK(r.value()[2].scheme == "negotiate");
  CHECK(r.value()[2].params.empty());
  CHECK(r.value()[3].scheme == "ntlm");
  CHECK(r.value()[3].token68 == "abc123==");
  CHECK(r.value()[4].params.at("error") == "x");
}

TEST_CASE("www-authenticate: accepts token values and keeps the first duplicate") {
  auto r = ParseWwwAuthenticate("Bearer realm=https://t/token,scope=a,scope=b");
  // "https://t/token" is not a token (':' and '/' are not tchars): the header is malformed.
  CHECK_FALSE(r.has_value());
  r = ParseWwwAuthenticate("Bearer realm=tok,scope=a,scope=b");
  REQUIRE(r.has_value());
  CHECK(r.value()[0].params.at("realm") == "tok");
  CHECK(r.value()[0].params.at("scope") == "a");
}

TEST_CASE("www-authenticate: rejects malformed headers with protocol errors") {
  for (const char* bad : {"", " , ,", R"(Bearer realm="unterminated)", R"(Bearer realm="a", scope=)",
                          R"(Bearer realm="a" junk)", R"(Bearer ="x")", "Bearer realm=\"a\x01\"",
                          R"("quoted")", R"(Bearer realm="a";x=1)", "Bearer\x01"}) {
    std::string shown(bad);
    CAPTURE(shown);
    auto r = ParseWwwAuthenticate(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kProtocol);
  }
}

TEST_CASE("www-authenticate: bounds hostile input") {
  std::string huge = "Bearer realm=\"" + std::string(20000, 'a') + "\"";
  CHECK(ParseWwwAuthenticate(huge).error().code == ErrorCode::kProtocol);
  std::string many = "Bearer a=1";
  for (int i = 0; i < 100; ++i) many += ",p" + std::to_string(i) + "=1";
  CHECK(ParseWwwAuthenticate(many).error().code == ErrorCode::kProtocol);
  std::string schemes;
  for (int i = 0; i < 100; ++i) schemes += "S" + std::to_string(i) + ", ";
  CHECK(ParseWwwAuthenticate(schemes).error().code == ErrorCode::kProtocol);
  // A trailing backslash inside quotes must not read past the end.
  CHECK_FALSE(ParseWwwAuthenticate("Bearer realm=\"abc\\").has_value());
  std::string nul("Bearer realm=\"a\0b\"", 18);
  CHECK_FALSE(ParseWwwAuthenticate(nul).has_value());
}

TEST_CASE("www-authenticate: reads a bare token68 ending in '=' as token68, not a parameter") {
  auto r = ParseWwwAuthenticate("Bearer realm=");
  REQUIRE(r.has_value());
  CHECK(r.value()[0].token68 == "realm=");
  CHECK(r.value()[0].params.empty());
}

TEST_SUITE_END();
}  // namespace shoal::upstream
