#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "lib/upstream/credentials.h"

#include "tests/support/why.h"

namespace shoal::upstream {
TEST_SUITE_BEGIN("upstream");

namespace {

// A config.json in a fresh temp dir, removed at scope exit.
class TempConfig {
 public:
  explicit TempConfig(const std::string& content) {
    char tmpl[] = "/tmp/shoal-creds-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/config.json";
    std::ofstream(path_) << content;
  }
  ~TempConfig() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

}  // namespace

TEST_CASE("credentials: loads auth and username/password entries from a docker config") {
  // "alice:s3cr:et" and "bob:pw" in base64.
  TempConfig cfg(R"({
    "auths": {
      "https://index.docker.io/v1/": {"auth": "YWxpY2U6czNjcjpldA=="},
      "gcr.io": {"username": "_json_key", "password": "{\"k\":1}"},
      "http://127.0.0.1:5000/v2/": {"auth": "Ym9iOnB3"},
      "helper.example": {},
      "token.example": {"identitytoken": "abc"}
    },
    "credsStore": "desktop"
  })");
  auto creds = Credentials::LoadDockerConfig(cfg.path());
  REQUIRE_MESSAGE(creds.has_value(), Why(creds));
  CHECK(creds.value().size() == 3);
  auto hub = creds.value().For("docker.io");
  REQUIRE(hub.has_value());
  CHECK(hub->username == "alice");
  CHECK(hub->password == "s3cr:et");
  auto gcr = creds.value().For("GCR.io");
  REQUIRE(gcr.has_value());
  CHECK(gcr->username == "_json_key");
  CHECK(gcr->password == "{\"k\":1}");
  auto local = creds.value().For("127.0.0.1:5000");
  REQUIRE(local.has_value());
  CHECK(local->username == "bob");
  CHECK_FALSE(creds.value().For("127.0.0.1:5001").has_value());
  CHECK_FALSE(creds.value().For("helper.example").has_value());
  CHECK_FALSE(creds.value().For("quay.io").has_value());
}

TEST_CASE("credentials: treats Docker Hub aliases as docker.io") {
  Credentials c;
  c.Add("registry-1.docker.io", BasicAuth{"u", "p"});
  for (const char* name : {"docker.io", "index.docker.io", "registry-1.docker.io",
                           "registry.hub.docker.com", "https://index.docker.io/v1/"}) {
    std::string shown(name);
    CAPTURE(shown);
    REQUIRE(c.For(name).has_value());
    CHECK(c.For(name)->username == "u");
  }
  c.Add("docker.io", BasicAuth{"v", "q"});
  CHECK(c.For("index.docker.io")->username == "v");
}

TEST_CASE("credentials: builds a Basic authorization value") {
  CHECK(BasicAuthHeader(BasicAuth{"bob", "pw"}) == "Basic Ym9iOnB3");
  CHECK(BasicAuthHeader(BasicAuth{"alice", "s3cr:et"}) == "Basic YWxpY2U6czNjcjpldA==");
}

TEST_CASE("credentials: reports missing and malformed files without quoting secrets") {
  auto missing = Credentials::LoadDockerConfig("/nonexistent/shoal/config.json");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == ErrorCode::kIo);
  CHECK(missing.error().message.find("/nonexistent/shoal/config.json") != std::string::npos);

  TempConfig not_json("{\"auths\": {\"h\": {\"auth\": \"SECRET\"");
  auto r = Credentials::LoadDockerConfig(not_json.path());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == ErrorCode::kInvalidArgument);
  CHECK(r.error().message.find("SECRET") == std::string::npos);

  TempConfig bad_b64(R"({"auths": {"h.example": {"auth": "SECRET!!"}}})");
  r = Credentials::LoadDockerConfig(bad_b64.path());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == ErrorCode::kInvalidArgument);
  CHECK(r.error().message.find("h.example") != std::string::npos);
  CHECK(r.error().message.find("SECRET") == std::string::npos);

  TempConfig no_colon(R"({"auths": {"h.example": {"auth": "c2VjcmV0"}}})");  // "secret"
  r = Credentials::LoadDockerConfig(no_colon.path());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("secret") == std::string::npos);

  TempConfig auths_array(R"({"auths": []})");
  CHECK(Credentials::LoadDockerConfig(auths_array.path()).error().code ==
        ErrorCode::kInvalidArgument);
}

TEST_CASE("credentials: a config without auths gives no credentials") {
  TempConfig empty(R"({"credsStore": "osxkeychain"})");
  auto r = Credentials::LoadDockerConfig(empty.path());
  REQUIRE(r.has_value());
  CHECK(r.value().size() == 0);
}

TEST_SUITE_END();
}  // namespace shoal::upstream
