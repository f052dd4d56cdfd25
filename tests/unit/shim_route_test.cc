#include <doctest/doctest.h>

#include "registry-shim/route.h"

namespace shoal::shim {

TEST_CASE("shim route: recognises the base, manifest and blob endpoints") {
  CHECK(ParseRoute("/v2/").value().kind == Route::Kind::kBase);
  CHECK(ParseRoute("/v2").value().kind == Route::Kind::kBase);
  auto m = ParseRoute("/v2/library/busybox/manifests/latest").value();
  CHECK(m.kind == Route::Kind::kManifest);
  CHECK(m.name == "library/busybox");
  CHECK(m.reference == "latest");
  auto b = ParseRoute("/v2/a/blobs/b/blobs/sha256:abc").value();
  CHECK(b.kind == Route::Kind::kBlob);
  CHECK(b.name == "a/blobs/b");
  CHECK(b.reference == "sha256:abc");
  CHECK(ParseRoute("/v2/x/blobs/uploads/").value().kind == Route::Kind::kPush);
  CHECK(ParseRoute("/nope").value().kind == Route::Kind::kNotFound);
  CHECK(ParseRoute("/metrics").value().kind == Route::Kind::kMetrics);
}

TEST_CASE("shim route: containerd's ns parameter is decoded") {
  auto r = ParseRoute("/v2/proj/img/manifests/1?ns=127.0.0.1%3A5000").value();
  REQUIRE(r.ns.has_value());
  CHECK(*r.ns == "127.0.0.1:5000");
  CHECK_FALSE(ParseRoute("/v2/proj/img/manifests/1?ns=%zz").has_value());
  CHECK_FALSE(ParseRoute("/v2/proj/img/manifests/1?ns=%4").has_value());
}

TEST_CASE("shim route: resolves the upstream registry from ns, a name prefix or the default") {
  auto ns = ResolveRepo("proj/img", std::string("gcr.io"), "docker.io").value();
  CHECK(ns.registry == "gcr.io");
  CHECK(ns.repository == "proj/img");
  auto prefix = ResolveRepo("gcr.io/proj/img", std::nullopt, "docker.io").value();
  CHECK(prefix.registry == "gcr.io");
  CHECK(prefix.repository == "proj/img");
  auto hub = ResolveRepo("busybox", std::nullopt, "docker.io").value();
  CHECK(hub.registry == "docker.io");
  CHECK(hub.repository == "library/busybox");
  auto plain = ResolveRepo("demo/app", std::nullopt, "docker.io").value();
  CHECK(plain.repository == "demo/app");
}

TEST_CASE("shim route: rejects invalid names and hostile ns values") {
  CHECK(ResolveRepo("Bad/Upper", std::nullopt, "docker.io").error().code ==
        ErrorCode::kInvalidArgument);
  CHECK(ResolveRepo("a//b", std::nullopt, "docker.io").error().code == ErrorCode::kInvalidArgument);
  CHECK(ResolveRepo("img", std::string("evil.com/../x"), "docker.io").error().code ==
        ErrorCode::kInvalidArgument);
  CHECK(ResolveRepo("img", std::string("evil.com@other"), "docker.io").error().code ==
        ErrorCode::kInvalidArgument);
}

}  // namespace shoal::shim
