#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "lib/http/url.h"

namespace shoal::http {
TEST_SUITE_BEGIN("http");

TEST_CASE("url: parses scheme, host, default port and target") {
  auto u = Url::Parse("https://Registry-1.Docker.io/v2/library/alpine/manifests/3.19");
  REQUIRE(u.has_value());
  CHECK(u.value().scheme == "https");
  CHECK(u.value().host == "registry-1.docker.io");
  CHECK(u.value().port == 443);
  CHECK(u.value().target == "/v2/library/alpine/manifests/3.19");
  CHECK(u.value().HostPort() == "registry-1.docker.io");
  CHECK(u.value().str() == "https://registry-1.docker.io/v2/library/alpine/manifests/3.19");
}

TEST_CASE("url: keeps an explicit port and omits a default one in HostPort") {
  auto u = Url::Parse("http://127.0.0.1:5000");
  REQUIRE(u.has_value());
  CHECK(u.value().port == 5000);
  CHECK(u.value().target == "/");
  CHECK(u.value().HostPort() == "127.0.0.1:5000");
  CHECK(Url::Parse("http://h:80/x").value().HostPort() == "h");
  CHECK(Url::Parse("https://h:443/x").value().str() == "https://h/x");
  CHECK(Url::Parse("https://h:80/x").value().HostPort() == "h:80");
}

TEST_CASE("url: supports IPv6 literal hosts") {
  auto u = Url::Parse("http://[::1]:5000/v2/");
  REQUIRE(u.has_value());
  CHECK(u.value().host == "::1");
  CHECK(u.value().port == 5000);
  CHECK(u.value().HostPort() == "[::1]:5000");
  CHECK(u.value().str() == "http://[::1]:5000/v2/");
  CHECK(Url::Parse("https://[2001:DB8::1]/").value().HostPort() == "[2001:db8::1]");
  CHECK(Url::Parse("http://[::1/").error().code == ErrorCode::kInvalidArgument);
  CHECK(Url::Parse("http://[zz::1]/").error().code == ErrorCode::kInvalidArgument);
  CHECK(Url::Parse("http://[::1]x/").error().code == ErrorCode::kInvalidArgument);
}

TEST_CASE("url: an IPv6 literal holds only hex digits, ':' and '.' (found by url_fuzz)") {
  // make_address_v6 accepts a "%zone" suffix of any bytes and stops at a NUL: these parsed, and
  // the host (control bytes included) went into the Host header.
  using namespace std::string_view_literals;
  for (std::string_view bad :
       {"http://[fe80::1%\0\x1ch0]:80/v2/"sv, "http://[::1%\r\nX-Injected: 1]/"sv,
        "http://[::1\0junk]/"sv, "http://[fe80::1%eth0]/"sv, "http://[fe80::1%25eth0]/"sv,
        "http://[::1 ]/"sv}) {
    auto u = Url::Parse(bad);
    REQUIRE_FALSE(u.has_value());
    CHECK(u.error().code == ErrorCode::kInvalidArgument);
    auto r = Url::Parse("https://r.example/a").value().Resolve(std::string("//") +
                                                               std::string(bad.substr(7)));
    CHECK_FALSE(r.has_value());
  }
  CHECK(Url::Parse("http://[::ffff:192.0.2.1]/").value().host == "::ffff:192.0.2.1");
  CHECK(Url::Parse("http://[FE80::A:b]:8080/").value().HostPort() == "[fe80::a:b]:8080");
}

TEST_CASE("url: keeps the query and drops the fragment") {
  auto u = Url::Parse("https://auth.docker.io/token?service=registry.docker.io&scope=x#frag");
  REQUIRE(u.has_value());
  CHECK(u.value().target == "/token?service=registry.docker.io&scope=x");
  CHECK(u.value().Redacted() == "https://auth.docker.io/token");
  CHECK(Url::Parse("http://h?x=1").value().target == "/?x=1");
}

TEST_CASE("url: rejects other schemes, userinfo, bad hosts and bad ports") {
  for (const char* bad :
       {"ftp://h/", "h/path", "/relative", "", "http:/h", "http://", "http://user:pw@h/",
        "http://h:0/", "http://h:65536/", "http://h:12a/", "http://h:123456/", "http://h h/",
        "http://h/a b", "http://h/\r\nX: y", "http://h/\x7f", "http://h/\xc3\xa9", "http://a,b/"}) {
    auto u = Url::Parse(bad);
    std::string shown(bad);
    CAPTURE(shown);
    REQUIRE_FALSE(u.has_value());
    CHECK(u.error().code == ErrorCode::kInvalidArgument);
  }
  CHECK(Url::Parse("ftp://h/").error().message.find("ftp://h/") != std::string::npos);
}

TEST_CASE("url: resolves absolute, scheme-relative and relative locations") {
  Url base = Url::Parse("https://registry.example:5000/v2/a/b/blobs/sha256:x?q=1").value();
  CHECK(base.Resolve("https://cdn.example/sig?X-Sig=abc").value().str() ==
        "https://cdn.example/sig?X-Sig=abc");
  CHECK(base.Resolve("//cdn.example:8443/p").value().str() == "https://cdn.example:8443/p");
  CHECK(base.Resolve("/other/path?x=1").value().str() ==
        "https://registry.example:5000/other/path?x=1");
  CHECK(base.Resolve("c").value().target == "/v2/a/b/blobs/c");
  CHECK(base.Resolve("../c").value().target == "/v2/a/b/c");
  CHECK(base.Resolve("../../../../../c").value().target == "/c");
  CHECK(base.Resolve("./c/./d/../e").value().target == "/v2/a/b/blobs/c/e");
  CHECK(base.Resolve("?z=2").value().target == "/v2/a/b/blobs/sha256:x?z=2");
  CHECK(base.Resolve("/a/../b#frag").value().target == "/b");
  CHECK(base.Resolve("HTTP://Other.Example/").value().str() == "http://other.example/");
}

TEST_CASE("url: refuses locations with other schemes or unsafe bytes") {
  Url base = Url::Parse("http://127.0.0.1:5000/v2/").value();
  CHECK(base.Resolve("").error().code == ErrorCode::kInvalidArgument);
  CHECK(base.Resolve("file:///etc/passwd").error().code == ErrorCode::kInvalidArgument);
  CHECK(base.Resolve("javascript:alert(1)").error().code == ErrorCode::kInvalidArgument);
  CHECK(base.Resolve("/a\r\nInjected: 1").error().code == ErrorCode::kInvalidArgument);
  CHECK(base.Resolve("/a b").error().code == ErrorCode::kInvalidArgument);
}

TEST_CASE("url: compares origins by scheme, host and port") {
  Url a = Url::Parse("https://h/x").value();
  CHECK(a.SameOrigin(Url::Parse("https://H:443/y").value()));
  CHECK_FALSE(a.SameOrigin(Url::Parse("http://h/x").value()));
  CHECK_FALSE(a.SameOrigin(Url::Parse("https://h:444/x").value()));
  CHECK_FALSE(a.SameOrigin(Url::Parse("https://cdn.h/x").value()));
}

TEST_CASE("url: escapes query values") {
  CHECK(QueryEscape("repository:library/alpine:pull") == "repository%3Alibrary%2Falpine%3Apull");
  CHECK(QueryEscape("a b&c=d~-._") == "a%20b%26c%3Dd~-._");
}

TEST_SUITE_END();
}  // namespace shoal::http
