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

namespace shoal::shim {

TEST_CASE("shim route: tags/list and referrers are endpoints of their own, with the raw query") {
  auto t = ParseRoute("/v2/gcr.io/proj/img/tags/list?n=2&last=v1&ns=gcr.io").value();
  CHECK(t.kind == Route::Kind::kTags);
  CHECK(t.name == "gcr.io/proj/img");
  CHECK(t.path == "/v2/gcr.io/proj/img/tags/list");
  CHECK(t.query == "n=2&last=v1&ns=gcr.io");
  REQUIRE(t.ns.has_value());
  // A repository may have components called "tags" or "referrers".
  auto named = ParseRoute("/v2/tags/list/tags/list").value();
  CHECK(named.kind == Route::Kind::kTags);
  CHECK(named.name == "tags/list");
  CHECK(ParseRoute("/v2/tags/list").value().kind == Route::Kind::kNotFound);
  auto r = ParseRoute("/v2/demo/app/referrers/sha256:abc?artifactType=x").value();
  CHECK(r.kind == Route::Kind::kReferrers);
  CHECK(r.name == "demo/app");
  CHECK(r.reference == "sha256:abc");
  auto m = ParseRoute("/v2/a/referrers/b/manifests/1").value();
  CHECK(m.kind == Route::Kind::kManifest);
  CHECK(m.name == "a/referrers/b");
  CHECK(ParseRoute("/v2/demo/app/whatever").value().kind == Route::Kind::kNotFound);
  CHECK(ParseRoute("/v2/_catalog").value().kind == Route::Kind::kNotFound);
  CHECK(ParseRoute("/v2/demo/app/blobs/").value().kind == Route::Kind::kNotFound);
  CHECK(ParseRoute("/v2/demo/app/manifests/").value().kind == Route::Kind::kNotFound);
}

TEST_CASE("shim route: Allow lists GET and HEAD for the pull API, nothing for pushes") {
  CHECK(AllowedMethods(Route::Kind::kManifest) == "GET, HEAD");
  CHECK(AllowedMethods(Route::Kind::kBlob) == "GET, HEAD");
  CHECK(AllowedMethods(Route::Kind::kTags) == "GET, HEAD");
  CHECK(AllowedMethods(Route::Kind::kBase) == "GET, HEAD");
  CHECK(AllowedMethods(Route::Kind::kPush) == "");
}

TEST_CASE("shim route: only the named query parameters are forwarded, still encoded") {
  CHECK(ForwardedQuery("n=2&last=v1&ns=gcr.io", {"n", "last"}).value() == "n=2&last=v1");
  CHECK(ForwardedQuery("ns=gcr.io&last=a.b-c_d", {"n", "last"}).value() == "last=a.b-c_d");
  CHECK(ForwardedQuery("", {"n"}).value() == "");
  CHECK(ForwardedQuery("artifactType=application%2Fvnd.example%2Bjson", {"artifactType"}).value() ==
        "artifactType=application%2Fvnd.example%2Bjson");
  CHECK(ForwardedQuery("artifactType=application/vnd.x+json", {"artifactType"}).value() ==
        "artifactType=application/vnd.x+json");
  CHECK(ForwardedQuery("n", {"n"}).value() == "n=");
  CHECK_FALSE(ForwardedQuery("last=a\"b", {"last"}).has_value());
  CHECK_FALSE(ForwardedQuery("last=%zz", {"last"}).has_value());
  CHECK_FALSE(ForwardedQuery("last=%4", {"last"}).has_value());
  // A parameter that is dropped is not checked.
  CHECK(ForwardedQuery("x=\"&n=1", {"n"}).value() == "n=1");
}

}  // namespace shoal::shim
