// Every mirror mode resolved by the same routing table, with the request targets the real
// clients send (see ../shared/reference/runtimes.md).
#include <doctest/doctest.h>

#include "registry-shim/route.h"

namespace shoal::shim {
namespace {

// Parses a request target the way the server does and resolves its repository.
Result<RepoRef> Resolve(std::string_view target, std::string_view default_registry = "docker.io") {
  auto route = ParseRoute(target);
  if (!route) return route.error();
  return ResolveRepo(route.value().name, route.value().ns, default_registry);
}

}  // namespace

TEST_CASE("route modes: dockerd registry-mirrors asks for Docker Hub names without a registry") {
  auto official = Resolve("/v2/library/busybox/manifests/1.36").value();
  CHECK(official.registry == "docker.io");
  CHECK(official.repository == "library/busybox");
  auto user = Resolve("/v2/someone/tool/blobs/sha256:" + std::string(64, 'a')).value();
  CHECK(user.registry == "docker.io");
  CHECK(user.repository == "someone/tool");
  // --default-registry changes where prefix-less names go.
  CHECK(Resolve("/v2/proj/img/manifests/1", "gcr.io").value().str() == "gcr.io/proj/img");
}

TEST_CASE("route modes: a name prefix carries the registry (dockerd, skopeo, CRI-O mirrors)") {
  CHECK(Resolve("/v2/gcr.io/proj/img/manifests/1").value().str() == "gcr.io/proj/img");
  CHECK(Resolve("/v2/127.0.0.1:5001/proj/img/manifests/1").value().str() ==
        "127.0.0.1:5001/proj/img");
  CHECK(Resolve("/v2/localhost/proj/img/manifests/1").value().str() == "localhost/proj/img");
  // A docker.io mirror location ("HOST:PORT/docker.io") and its aliases.
  CHECK(Resolve("/v2/docker.io/library/busybox/manifests/1").value().str() ==
        "docker.io/library/busybox");
  CHECK(Resolve("/v2/docker.io/busybox/manifests/1").value().str() == "docker.io/library/busybox");
  CHECK(Resolve("/v2/index.docker.io/library/x/manifests/1").value().registry == "docker.io");
  CHECK(Resolve("/v2/registry-1.docker.io/library/x/manifests/1").value().registry == "docker.io");
}

TEST_CASE("route modes: containerd's ?ns= wins and a repeated prefix is dropped") {
  CHECK(Resolve("/v2/proj/img/manifests/1?ns=gcr.io").value().str() == "gcr.io/proj/img");
  CHECK(Resolve("/v2/library/busybox/manifests/1?ns=docker.io").value().str() ==
        "docker.io/library/busybox");
  CHECK(Resolve("/v2/busybox/manifests/1?ns=docker.io").value().str() ==
        "docker.io/library/busybox");
  CHECK(Resolve("/v2/proj/img/blobs/sha256:" + std::string(64, 'b') + "?ns=127.0.0.1%3A5001")
            .value()
            .str() == "127.0.0.1:5001/proj/img");
  // A host URL ending in "/v2/gcr.io" (override_path) sends the prefix and ?ns= both.
  CHECK(Resolve("/v2/gcr.io/proj/img/manifests/1?ns=gcr.io").value().str() == "gcr.io/proj/img");
  // A different prefix is part of the repository name on the ns registry.
  CHECK(Resolve("/v2/quay.io/proj/img/manifests/1?ns=gcr.io").value().str() ==
        "gcr.io/quay.io/proj/img");
  // An empty ns is ignored; other query parameters too.
  CHECK(Resolve("/v2/proj/img/manifests/1?ns=&x=1").value().str() == "docker.io/proj/img");
  CHECK(Resolve("/v2/proj/img/manifests/1?x=1&ns=gcr.io").value().str() == "gcr.io/proj/img");
}

TEST_CASE("route modes: bad registries and names are refused with NAME_INVALID errors") {
  CHECK(Resolve("/v2/proj/img/manifests/1?ns=gcr.io%2Fevil").error().code ==
        ErrorCode::kInvalidArgument);
  CHECK(Resolve("/v2/proj/img/manifests/1?ns=a%20b").error().code == ErrorCode::kInvalidArgument);
  CHECK(Resolve("/v2/gcr.io/Proj/img/manifests/1").error().code == ErrorCode::kInvalidArgument);
}

}  // namespace shoal::shim
