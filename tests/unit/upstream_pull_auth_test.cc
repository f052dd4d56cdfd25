// pull_auth in the upstream map (flags and map file) and the client credentials the shim reads.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lib/core/base64.h"
#include "lib/upstream/credentials.h"
#include "lib/upstream/upstream_map.h"

namespace shoal::upstream {
TEST_SUITE_BEGIN("upstream");

namespace {

class MapFile {
 public:
  explicit MapFile(const std::string& content) {
    char tmpl[] = "/tmp/shoal-pullauth-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/map.json";
    std::ofstream(path_) << content;
  }
  ~MapFile() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

using PullAuth = UpstreamMap::PullAuth;

}  // namespace

TEST_CASE("pull auth: node is the default and flags set the default or one registry") {
  UpstreamMap map;
  CHECK(map.PullAuthFor("gcr.io") == PullAuth::kNode);
  REQUIRE(map.SetPullAuth("client").has_value());
  CHECK(map.PullAuthFor("gcr.io") == PullAuth::kClient);
  REQUIRE(map.SetPullAuth("GCR.io=deny").has_value());
  CHECK(map.PullAuthFor("gcr.io") == PullAuth::kDeny);
  // Docker Hub's aliases are one registry.
  REQUIRE(map.SetPullAuth("index.docker.io=node").has_value());
  CHECK(map.PullAuthFor("docker.io") == PullAuth::kNode);
  CHECK(map.PullAuthFor("quay.io") == PullAuth::kClient);
  CHECK(map.Describe().find("pull_auth client by default") != std::string::npos);
}

TEST_CASE("pull auth: a bad mode or registry names the spec and the accepted values") {
  UpstreamMap map;
  auto bad = map.SetPullAuth("gcr.io=public");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == ErrorCode::kInvalidArgument);
  CHECK(bad.error().message.find("gcr.io=public") != std::string::npos);
  CHECK(bad.error().message.find("\"client\", \"node\", \"deny\"") != std::string::npos);
  auto host = map.SetPullAuth("bad host!=client");
  REQUIRE_FALSE(host.has_value());
  CHECK(host.error().message.find("bad host!=client") != std::string::npos);
  CHECK_FALSE(map.SetPullAuth("").has_value());
  CHECK(map.PullAuthFor("gcr.io") == PullAuth::kNode);  // nothing changed
}

TEST_CASE("pull auth: the map file sets it per entry and as the default") {
  MapFile file(R"({"upstreams": {"gcr.io": "https://gcr.io",
                                 "corp.io": {"url": "https://corp.io", "pull_auth": "client"},
                                 "ghcr.io": {"url": "https://ghcr.io", "pull_auth": "deny"}},
                   "pull_auth": "node"})");
  UpstreamMap map;
  Credentials creds;
  REQUIRE(map.LoadFile(file.path(), creds).has_value());
  CHECK(map.PullAuthFor("gcr.io") == PullAuth::kNode);
  CHECK(map.PullAuthFor("corp.io") == PullAuth::kClient);
  CHECK(map.PullAuthFor("ghcr.io") == PullAuth::kDeny);
  CHECK(map.PullAuthFor("unmapped.example") == PullAuth::kNode);
  // Flags come after the file and win.
  REQUIRE(map.SetPullAuth("corp.io=node").has_value());
  CHECK(map.PullAuthFor("corp.io") == PullAuth::kNode);
}

TEST_CASE("pull auth: a map file with a bad pull_auth is refused and changes nothing") {
  UpstreamMap map;
  Credentials creds;
  MapFile entry(R"({"upstreams": {"corp.io": {"url": "https://corp.io", "pull_auth": "yes"}}})");
  auto e = map.LoadFile(entry.path(), creds);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().message.find("upstream corp.io") != std::string::npos);
  CHECK(e.error().message.find("pull_auth \"yes\"") != std::string::npos);
  CHECK_FALSE(map.Contains("corp.io"));
  MapFile top(R"({"pull_auth": 1})");
  auto t = map.LoadFile(top.path(), creds);
  REQUIRE_FALSE(t.has_value());
  CHECK(t.error().message.find("\"pull_auth\" is not a string") != std::string::npos);
  MapFile typed(R"({"upstreams": {"corp.io": {"url": "https://corp.io", "pull_auth": true}}})");
  CHECK_FALSE(map.LoadFile(typed.path(), creds).has_value());
  CHECK(map.PullAuthFor("corp.io") == PullAuth::kNode);
}

TEST_CASE("pull auth: Basic Authorization headers are read, other schemes and empty users not") {
  auto alice = ParseBasicAuthorization("Basic " + Base64Encode("alice:s3:cret"));
  REQUIRE(alice.has_value());
  CHECK(alice->username == "alice");
  CHECK(alice->password == "s3:cret");  // the first ':' separates
  auto lower = ParseBasicAuthorization("basic  " + Base64Encode("bob:") + " ");
  REQUIRE(lower.has_value());
  CHECK(lower->username == "bob");
  CHECK(lower->password.empty());
  CHECK_FALSE(ParseBasicAuthorization("Basic Og==").has_value());  // podman's empty ":"
  CHECK_FALSE(ParseBasicAuthorization("Bearer abc.def").has_value());
  CHECK_FALSE(ParseBasicAuthorization("Basic !!!").has_value());
  CHECK_FALSE(ParseBasicAuthorization("Basic " + Base64Encode("nocolon")).has_value());
  CHECK_FALSE(ParseBasicAuthorization("").has_value());
  CHECK_FALSE(ParseBasicAuthorization("Basic").has_value());
}

TEST_SUITE_END();
}  // namespace shoal::upstream
