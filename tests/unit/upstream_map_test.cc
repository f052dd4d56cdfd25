#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lib/core/base64.h"
#include "lib/upstream/upstream_map.h"

#include "tests/support/why.h"

namespace shoal::upstream {
TEST_SUITE_BEGIN("upstream");

namespace {

// A file in a fresh temp dir, removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    char tmpl[] = "/tmp/shoal-map-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/map.json";
    std::ofstream(path_) << content;
  }
  ~TempFile() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

}  // namespace

TEST_CASE("upstream map: Docker Hub goes to registry-1.docker.io unless mapped elsewhere") {
  UpstreamMap map;
  auto hub = map.Resolve("docker.io").value();
  CHECK(hub.name == "docker.io");
  CHECK(hub.base.str() == "https://registry-1.docker.io/");
  CHECK(map.Resolve("index.docker.io").value().base.host == "registry-1.docker.io");
  REQUIRE(map.AddSpecs({"docker.io=http://127.0.0.1:5001"}).has_value());
  CHECK(map.Resolve("docker.io").value().base.str() == "http://127.0.0.1:5001/");
  CHECK(map.Resolve("registry-1.docker.io").value().base.port == 5001);
}

TEST_CASE("upstream map: entries from specs, keys normalised, later entries win") {
  UpstreamMap map;
  REQUIRE(
      map.AddSpecs({"GCR.io=http://127.0.0.1:5001", "ghcr.io=https://ghcr.io:8443"}).has_value());
  REQUIRE(map.AddSpecs({"gcr.io=http://127.0.0.1:5002"}).has_value());
  CHECK(map.Resolve("gcr.io").value().base.port == 5002);
  CHECK(map.Resolve("ghcr.io").value().base.str() == "https://ghcr.io:8443/");
  CHECK(map.Contains("gcr.io"));
  CHECK(map.Registries() == std::vector<std::string>{"docker.io", "gcr.io", "ghcr.io"});
}

TEST_CASE("upstream map: bad specs are refused with the spec in the message") {
  UpstreamMap map;
  auto no_eq = map.AddSpecs({"gcr.io"});
  REQUIRE_FALSE(no_eq.has_value());
  CHECK(no_eq.error().message.find("REGISTRY=URL") != std::string::npos);
  CHECK_FALSE(map.AddSpecs({"=http://x"}).has_value());
  CHECK_FALSE(map.AddSpecs({"gcr.io=ftp://x"}).has_value());
  auto path = map.AddSpecs({"gcr.io=https://mirror.example/v2/gcr"});
  REQUIRE_FALSE(path.has_value());
  CHECK(path.error().message.find("has a path") != std::string::npos);
  CHECK_FALSE(map.AddSpecs({"bad host=http://x"}).has_value());
}

TEST_CASE("upstream map: unmapped registries are refused by default, else follow the policy") {
  UpstreamMap map;
  CHECK(map.unmapped() == UpstreamMap::Unmapped::kError);
  auto refused = map.Resolve("quay.io");
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == ErrorCode::kRefused);
  CHECK(refused.error().message.find("quay.io") != std::string::npos);
  CHECK(refused.error().message.find("docker.io") != std::string::npos);  // lists the mapped
  CHECK(map.Resolve("docker.io").has_value());
  REQUIRE(map.SetUnmapped("https").has_value());
  auto https = map.Resolve("quay.io").value();
  CHECK(https.base.str() == "https://quay.io/");
  CHECK(https.addresses == http::AddressPolicy::kGlobalOnly);  // checked again once resolved
  REQUIRE(map.SetUnmapped("http://127.0.0.1:6000").has_value());
  auto fallback = map.Resolve("quay.io").value();
  CHECK(fallback.name == "quay.io");  // credentials and tokens stay keyed by the registry
  CHECK(fallback.base.str() == "http://127.0.0.1:6000/");
  CHECK(fallback.addresses == http::AddressPolicy::kAny);  // the operator's own endpoint
  CHECK_FALSE(map.SetUnmapped("sometimes").has_value());
}

TEST_CASE("upstream map: under https, unmapped IP literals that are not global are refused") {
  UpstreamMap map;
  REQUIRE(map.SetUnmapped("https").has_value());
  REQUIRE(map.AddSpecs({"127.0.0.1:5000=http://127.0.0.1:5000", "lab.local=http://10.0.0.9"})
              .has_value());
  for (const char* registry :
       {"127.0.0.1:17998", "127.0.0.1", "10.1.2.3", "10.1.2.3:443", "172.20.0.1:5000",
        "192.168.1.10:5000", "100.64.0.1", "169.254.169.254", "0.0.0.0:5000", "[::1]:5000", "[::1]",
        "[fd00::1]:5000", "[fe80::1]:5000", "[::ffff:7f00:1]:5000", "[ff02::1]"}) {
    CAPTURE(registry);
    auto r = map.Resolve(registry);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kRefused);
  }
  // The operator's entries go anywhere, loopback included; mapping is by name, not by address.
  auto mapped = map.Resolve("127.0.0.1:5000").value();
  CHECK(mapped.base.str() == "http://127.0.0.1:5000/");
  CHECK(mapped.addresses == http::AddressPolicy::kAny);
  CHECK(map.Resolve("lab.local").value().addresses == http::AddressPolicy::kAny);
  CHECK(map.Resolve("127.0.0.1:5001").error().code == ErrorCode::kRefused);
  // Global literals and names pass here; names are checked by the HTTP client once resolved.
  CHECK(map.Resolve("8.8.8.8:5000").value().addresses == http::AddressPolicy::kGlobalOnly);
  CHECK(map.Resolve("localhost:5000").value().addresses == http::AddressPolicy::kGlobalOnly);
}

TEST_CASE("upstream map: a map file gives endpoints, credentials and the unmapped policy") {
  TempFile file(R"({
    "upstreams": {
      "gcr.io": "http://127.0.0.1:5001",
      "ghcr.io": {"url": "https://ghcr.io", "auth": ")" +
                Base64Encode("bot:tok3n") + R"("},
      "quay.io": {"url": "https://quay.io", "username": "q", "password": "pw"}
    },
    "auths": {"https://index.docker.io/v1/": {"username": "hub", "password": "hubpw"}},
    "unmapped": "error"
  })");
  UpstreamMap map;
  Credentials creds;
  creds.Add("ghcr.io", BasicAuth{"old", "replaced"});
  auto st = map.LoadFile(file.path(), creds);
  REQUIRE_MESSAGE(st.has_value(), Why(st));
  CHECK(map.Resolve("gcr.io").value().base.str() == "http://127.0.0.1:5001/");
  CHECK(map.Resolve("ghcr.io").value().base.host == "ghcr.io");
  CHECK(map.unmapped() == UpstreamMap::Unmapped::kError);
  CHECK_FALSE(map.Resolve("example.com").has_value());
  REQUIRE(creds.For("ghcr.io").has_value());
  CHECK(creds.For("ghcr.io")->username == "bot");
  CHECK(creds.For("ghcr.io")->password == "tok3n");
  CHECK(creds.For("quay.io")->password == "pw");
  CHECK(creds.For("docker.io")->username == "hub");
  CHECK_FALSE(creds.For("gcr.io").has_value());
}

TEST_CASE("upstream map: a bad map file changes nothing and never quotes secrets") {
  UpstreamMap map;
  Credentials creds;
  TempFile bad_auth(R"({"upstreams": {"gcr.io": "http://127.0.0.1:1",
                        "ghcr.io": {"url": "https://ghcr.io", "auth": "!!not-base64-s3cret"}}})");
  auto st = map.LoadFile(bad_auth.path(), creds);
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == ErrorCode::kInvalidArgument);
  CHECK(st.error().message.find("ghcr.io") != std::string::npos);
  CHECK(st.error().message.find("s3cret") == std::string::npos);
  CHECK_FALSE(map.Contains("gcr.io"));  // the good entry was not kept
  CHECK(creds.size() == 0);

  TempFile junk("{\"upstreams\": [1, 2], \"password\": \"s3cret\"");
  auto j = map.LoadFile(junk.path(), creds);
  REQUIRE_FALSE(j.has_value());
  CHECK(j.error().message.find("s3cret") == std::string::npos);
  TempFile unknown(R"({"upstream": {}})");
  auto u = map.LoadFile(unknown.path(), creds);
  REQUIRE_FALSE(u.has_value());
  CHECK(u.error().message.find("unknown key \"upstream\"") != std::string::npos);
  CHECK(map.LoadFile("/nonexistent/map.json", creds).error().code == ErrorCode::kIo);
  TempFile no_url(R"({"upstreams": {"gcr.io": {"username": "u", "password": "p"}}})");
  CHECK_FALSE(map.LoadFile(no_url.path(), creds).has_value());
}

TEST_SUITE_END();
}  // namespace shoal::upstream
