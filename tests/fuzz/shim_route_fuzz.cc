// Fuzzes the shim's request routing, the pure steps of every request it dispatches: ParseRoute
// over the raw request target, then ResolveRepo (every mirror mode: ?ns=, a registry-host prefix,
// the default registry) and ResolveConnectRepo (inside a terminated CONNECT), and the reference
// parsing of the manifest and blob handlers (oci::ParseManifestRef, Digest::Parse).
//
// Properties: ParseRoute fails only with kInvalidArgument (-> 400 NAME_INVALID) and a printable
// message; a route's name and reference are exactly the path's parts ("/v2/" name
// "/manifests/" reference), and the query never changes them; ?ns= is percent-decoded. A
// resolved repository has a valid, normalised registry host and a valid name (Docker Hub names
// have a "/"), and resolving "registry/repository" again gives the same repository whatever the
// default registry (for registries a name prefix can name). Routing errors name what was wrong
// in printable text.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "lib/core/digest.h"
#include "lib/oci/reference.h"
#include "registry-shim/route.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using shim::Route;

namespace {

std::string Encode(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : bytes) {
    auto u = static_cast<unsigned char>(c);
    out += '%';
    out += kHex[u >> 4];
    out += kHex[u & 15];
  }
  return out;
}

void CheckError(const Error& e) {
  FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument);
  FUZZ_CHECK(!e.message.empty());
  FUZZ_CHECK(fuzz::IsPrintable(e.message));
}

void CheckRepo(const shim::RepoRef& repo) {
  FUZZ_CHECK(oci::ValidateRegistryHost(repo.registry));
  FUZZ_CHECK(oci::NormalizeRegistryHost(repo.registry) == repo.registry);
  FUZZ_CHECK(oci::ValidateName(repo.repository));
  if (repo.registry == "docker.io") FUZZ_CHECK(repo.repository.find('/') != std::string::npos);
}

// The pure steps of the shim's dispatch for one parsed route.
void Dispatch(const Route& r) {
  if (r.kind != Route::Kind::kManifest && r.kind != Route::Kind::kBlob) return;
  for (std::string_view default_registry : {"docker.io", "registry.example:5000"}) {
    auto repo = shim::ResolveRepo(r.name, r.ns, default_registry);
    if (!repo) {
      CheckError(repo.error());
      continue;
    }
    CheckRepo(repo.value());
    // The canonical name routes to the same repository, whatever the default registry, when
    // the registry looks like one in a name prefix (?ns= may name a single-label host such as
    // "gcr", which a name prefix cannot: "gcr/x" is repository "gcr/x" on the default).
    if (!oci::LooksLikeRegistryHost(repo.value().registry)) continue;
    auto again = shim::ResolveRepo(repo.value().str(), std::nullopt, "other.example");
    FUZZ_CHECK(again);
    FUZZ_CHECK(again.value().registry == repo.value().registry);
    FUZZ_CHECK(again.value().repository == repo.value().repository);
  }
  auto tunnel = shim::ResolveConnectRepo(r.name, "gcr.io");
  if (tunnel) {
    CheckRepo(tunnel.value());
    FUZZ_CHECK(tunnel.value().repository == r.name);
  } else {
    CheckError(tunnel.error());
  }
  if (r.kind == Route::Kind::kManifest) {
    auto ref = oci::ParseManifestRef(r.reference);
    if (ref) {
      FUZZ_CHECK(ref.value().IsDigest() ? ref.value().tag.empty()
                                        : static_cast<bool>(oci::ValidateTag(ref.value().tag)));
    } else {
      // The handler answers 400 with it (JSON-escaped: the text may hold the reference's bytes).
      FUZZ_CHECK(!ref.error().message.empty());
    }
  } else {
    auto digest = Digest::Parse(r.reference);
    if (digest) FUZZ_CHECK(digest.value().str() == r.reference);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view target(reinterpret_cast<const char*>(data), size);
  auto parsed = shim::ParseRoute(target);
  if (!parsed) {
    CheckError(parsed.error());
    return 0;
  }
  const Route& r = parsed.value();
  const size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  switch (r.kind) {
    case Route::Kind::kMetrics:
      FUZZ_CHECK(path == "/metrics");
      break;
    case Route::Kind::kHealth:
      FUZZ_CHECK(path == "/healthz" || path == "/readyz");
      break;
    case Route::Kind::kBase:
      FUZZ_CHECK(path == "/v2" || path == "/v2/");
      break;
    case Route::Kind::kManifest:
      FUZZ_CHECK(path == "/v2/" + r.name + "/manifests/" + r.reference);
      break;
    case Route::Kind::kBlob:
      FUZZ_CHECK(path == "/v2/" + r.name + "/blobs/" + r.reference);
      break;
    case Route::Kind::kPush:
      FUZZ_CHECK(path.starts_with("/v2/" + r.name + "/blobs/uploads"));
      break;
    case Route::Kind::kTags:
      FUZZ_CHECK(path == "/v2/" + r.name + "/tags/list");
      break;
    case Route::Kind::kReferrers:
      FUZZ_CHECK(path == "/v2/" + r.name + "/referrers/" + r.reference);
      break;
    case Route::Kind::kNotFound:
      break;
  }
  if (r.kind != Route::Kind::kNotFound) {
    FUZZ_CHECK(path.find('%') == std::string_view::npos);
  }
  if (q == std::string_view::npos) FUZZ_CHECK(!r.ns.has_value());

  // The query never changes what the path means.
  auto bare = shim::ParseRoute(path);
  FUZZ_CHECK(bare);
  FUZZ_CHECK(bare.value().kind == r.kind);
  FUZZ_CHECK(bare.value().name == r.name && bare.value().reference == r.reference);

  // ?ns= carries any bytes percent-encoded; the last one given wins.
  const std::string_view ns_bytes = target.substr(0, std::min<size_t>(target.size(), 64));
  auto with_ns = shim::ParseRoute(std::string(path) + "?ns=x&ns=" + Encode(ns_bytes));
  FUZZ_CHECK(with_ns);
  FUZZ_CHECK(with_ns.value().ns == std::string(ns_bytes));

  Dispatch(r);
  if (with_ns.value().kind == Route::Kind::kManifest) Dispatch(with_ns.value());
  return 0;
}
