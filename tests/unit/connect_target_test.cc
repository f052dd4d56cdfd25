// CONNECT targets of the shim's HTTPS proxy mode: what registry they stand for, and precise
// errors for malformed ones.
#include <doctest/doctest.h>

#include "registry-shim/connect_proxy.h"

#include "tests/support/why.h"

namespace shoal::shim {

TEST_CASE("connect: targets parse to host and port and name their registry") {
  struct Case {
    const char* target;
    const char* host;
    uint16_t port;
    const char* registry;
  };
  const Case cases[] = {
      {"gcr.io:443", "gcr.io", 443, "gcr.io"},
      {"GCR.io:443", "gcr.io", 443, "gcr.io"},
      {"registry-1.docker.io:443", "registry-1.docker.io", 443, "docker.io"},
      {"registry.example:5000", "registry.example", 5000, "registry.example:5000"},
      {"127.0.0.1:8080", "127.0.0.1", 8080, "127.0.0.1:8080"},
      {"[::1]:8443", "::1", 8443, "[::1]:8443"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.target);
    auto t = ParseConnectTarget(c.target);
    REQUIRE_MESSAGE(t.has_value(), Why(t));
    CHECK(t.value().host == c.host);
    CHECK(t.value().port == c.port);
    CHECK(t.value().Registry() == c.registry);
  }
}

TEST_CASE("connect: malformed targets are refused with a message naming the problem") {
  struct Case {
    const char* target;
    const char* says;
  };
  const Case cases[] = {
      {"gcr.io", "has no port"},
      {"", "is empty"},
      {"/v2/", "has no port"},
      {"gcr.io:", "empty port"},
      {"gcr.io:0", "invalid port"},
      {"gcr.io:65536", "invalid port"},
      {"gcr.io:https", "invalid port"},
      {"bad host:443", "is not HOST:PORT"},
      {"-x.example:443", "is not HOST:PORT"},
      {"[::1]", "has no port"},
      {"[::1:443", "without"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.target);
    auto t = ParseConnectTarget(c.target);
    REQUIRE_FALSE(t.has_value());
    CHECK(t.error().code == ErrorCode::kInvalidArgument);
    CHECK_MESSAGE(t.error().message.find(c.says) != std::string::npos, t.error().message);
    CHECK(t.error().message.find("CONNECT target") != std::string::npos);
  }
}

}  // namespace shoal::shim
