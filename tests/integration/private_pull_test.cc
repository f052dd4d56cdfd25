// pull_auth (docs/security.md, "Private images (built)"): a client's own credentials, checked
// upstream, decide who gets a private image from the shim, also when the node has it cached and
// for blobs of other repositories; deny and node do as documented; public repositories need
// nothing. Real parts: Debian's docker-registry with htpasswd (alice:s3cret) and an anonymous
// one, the real shoal-agent, containerd's ctr with a hosts.toml from `shoalctl config`.
#include <doctest/doctest.h>

#include "lib/core/base64.h"
#include "lib/core/sha256.h"
#include "tests/support/agent.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

const std::string kAlice = "Basic " + Base64Encode("alice:s3cret");
const std::string kWrong = "Basic " + Base64Encode("alice:not-the-password");
const std::string kManifestAccept =
    "application/vnd.oci.image.manifest.v1+json,application/vnd.oci.image.index.v1+json";

// An htpasswd registry holding private proj/a:1 and proj/b:1, an anonymous one holding
// proj/pub:1, and an agent that maps the private one under four names, one per mode:
// priv.test (client), deny.test (deny), node.test (node); pub.test (client) is the public one.
// The agent has alice's credentials for every name (the node's credentials).
struct World {
  TempDir dir{"shoal-private"};
  std::unique_ptr<Registry> registry, public_registry;
  std::unique_ptr<Agent> agent;
  BuiltImage a, b, pub;

  World() {
    RegistryOptions ro;
    ro.auth = RegistryOptions::Auth::kHtpasswd;
    auto reg = Registry::Start(ro);
    REQUIRE_MESSAGE(reg.has_value(), Why(reg));
    registry = std::move(reg.value());
    auto open = Registry::Start();
    REQUIRE_MESSAGE(open.has_value(), Why(open));
    public_registry = std::move(open.value());
    a = Push(*registry, "proj/a", 7101);
    b = Push(*registry, "proj/b", 7202);
    pub = Push(*public_registry, "proj/pub", 7303);
    const std::string auth = Base64Encode("alice:s3cret");
    auto entry = [&](const std::string& url, const std::string& mode) {
      return R"({"url": ")" + url + R"(", "auth": ")" + auth + R"(", "pull_auth": ")" + mode +
             R"("})";
    };
    WriteFile(dir.Sub("map.json"),
              R"({"upstreams": {"priv.test": )" + entry(registry->Url(), "client") +
                  R"(, "deny.test": )" + entry(registry->Url(), "deny") +
                  R"(, "node.test": )" + entry(registry->Url(), "node") +
                  R"(, "pub.test": {"url": ")" + public_registry->Url() +
                  R"(", "pull_auth": "client"}}})");
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.extra_args = {"--upstream-map-file", dir.Sub("map.json")};  // the kit logs at debug
    auto started = Agent::Start(opts);
    REQUIRE_MESSAGE(started.has_value(), Why(started));
    agent = std::move(started.value());
  }

  BuiltImage Push(const Registry& reg, const std::string& name, uint64_t seed) {
    ImageSpec spec;
    spec.layers.push_back(LayerSpec{Compression::kGzip, 16 << 10, {}, seed});
    spec.layers.push_back(LayerSpec{Compression::kGzip, 4 << 10, {}, seed + 1});
    auto built = BuildImage(spec, dir.Sub("layout-" + std::to_string(seed)), "1");
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    auto pushed = PushImage(reg, dir.Sub("layout-" + std::to_string(seed)), "1", name);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return built.value();
  }

  // GET (or HEAD) of /v2/<registry>/<repo>/<what> on the shim (name-prefix mode).
  HttpResponse Get(const std::string& path, const std::string& authorization = "",
                   const std::string& method = "GET") const {
    std::vector<std::pair<std::string, std::string>> headers = {{"Accept", kManifestAccept}};
    if (!authorization.empty()) headers.emplace_back("Authorization", authorization);
    auto r = HttpRequest(method, agent->Url() + "/v2/" + path, headers);
    // A request that fails outright shows the agent's log: what it was waiting for.
    REQUIRE_MESSAGE(r.has_value(), (Why(r) + "\n" + agent->LogTail()));
    return r.value();
  }

  double PullAuth(const std::string& mode, const std::string& result) const {
    return agent->Metric("shoal_shim_pull_auth_total", {{"registry_mode", mode}, {"result", result}});
  }

  // Every blob of `image` through `path` (e.g. "priv.test/proj/a") with `authorization`: all 200
  // and the right bytes.
  void CheckBlobs(const std::string& path, const BuiltImage& image,
                  const std::string& authorization) const {
    std::vector<Digest> blobs = image.layer_digests;
    blobs.push_back(image.config_digest);
    for (const Digest& d : blobs) {
      HttpResponse blob = Get(path + "/blobs/" + d.str(), authorization);
      CAPTURE(d.str());
      CHECK_MESSAGE(blob.status == 200, blob.body);
      CHECK(Sha256::Of(blob.body) == d);
    }
  }
};

bool IsChallenge(const HttpResponse& r) {
  return r.status == 401 && r.Header("www-authenticate") == "Basic realm=\"shoal\"";
}

}  // namespace

TEST_CASE("private: a client without the right credentials gets 401 with a challenge, not the cached image") {
  World w;
  // The node already has proj/a: pulled through the node-mode name (the node's credentials).
  HttpResponse warm = w.Get("node.test/proj/a/manifests/1");
  REQUIRE_MESSAGE(warm.status == 200, (warm.body + "\n" + w.agent->LogTail()));
  w.CheckBlobs("node.test/proj/a", w.a, "");
  const double cached_before = w.agent->Metric("shoal_cache_blob_hits_total");

  // /v2/ still answers 200 without a challenge.
  HttpResponse ping = w.Get("");
  CHECK(ping.status == 200);
  CHECK(ping.Header("www-authenticate").empty());

  // No credentials: 401 with the Basic challenge for the manifest (tag and digest) and blobs.
  for (const std::string& path :
       {std::string("priv.test/proj/a/manifests/1"),
        "priv.test/proj/a/manifests/" + w.a.manifest_digest.str(),
        "priv.test/proj/a/blobs/" + w.a.layer_digests[0].str()}) {
    CAPTURE(path);
    HttpResponse r = w.Get(path);
    CHECK(IsChallenge(r));
    CHECK(r.body.find("UNAUTHORIZED") != std::string::npos);
    CHECK(r.body.find(w.a.manifest_json) == std::string::npos);
    CHECK(r.Header("docker-content-digest").empty());
    CHECK(IsChallenge(w.Get(path, "", "HEAD")));
    // podman's empty "Basic Og==" and a Bearer token are no credentials either.
    CHECK(IsChallenge(w.Get(path, "Basic Og==")));
    CHECK(IsChallenge(w.Get(path, "Bearer some-token")));
    // Wrong credentials: refused upstream, 401 with the challenge again.
    HttpResponse wrong = w.Get(path, kWrong);
    CHECK(IsChallenge(wrong));
    CHECK(wrong.body.find("refused") != std::string::npos);
  }
  CHECK(w.PullAuth("client", "challenge") >= 12);
  CHECK(w.PullAuth("client", "refused") >= 3);
  // None of these reached the cache.
  CHECK(w.agent->Metric("shoal_cache_blob_hits_total") == cached_before);

  // alice: the manifest and every blob, from the node's cache.
  HttpResponse manifest = w.Get("priv.test/proj/a/manifests/1", kAlice);
  REQUIRE_MESSAGE(manifest.status == 200, (manifest.body + "\n" + w.agent->LogTail()));
  CHECK(manifest.Header("docker-content-digest") == w.a.manifest_digest.str());
  CHECK(manifest.body == w.a.manifest_json);
  CHECK(w.Get("priv.test/proj/a/manifests/" + w.a.manifest_digest.str(), kAlice).status == 200);
  w.CheckBlobs("priv.test/proj/a", w.a, kAlice);
  CHECK(w.agent->Metric("shoal_cache_blob_hits_total") >= cached_before + 3);
  CHECK(w.PullAuth("client", "verified") >= 1);
  CHECK(w.PullAuth("client", "cached") >= 3);
  // The verdict is cached: one upstream check with alice's credentials for all those requests.
  CHECK(w.agent->Metric("shoal_pull_auth_upstream_checks_total",
                        {{"credentials", "client"}, {"result", "granted"}}) == 1);

  // The client's credentials are only hashed: never in the agent's (debug) log.
  const std::string log = w.agent->Log();
  for (const std::string& secret : {std::string("not-the-password"), Base64Encode("alice:s3cret"),
                                    Base64Encode("alice:not-the-password"), std::string("s3cret")}) {
    CAPTURE(secret);
    CHECK(log.find(secret) == std::string::npos);
  }
}

TEST_CASE("private: credentials checked for repository A do not get what only repository B holds") {
  World w;
  // proj/b is in the node's cache (alice pulled it), manifest and blobs.
  REQUIRE(w.Get("priv.test/proj/b/manifests/1", kAlice).status == 200);
  w.CheckBlobs("priv.test/proj/b", w.b, kAlice);
  // alice is checked for proj/a and pulls it.
  REQUIRE(w.Get("priv.test/proj/a/manifests/1", kAlice).status == 200);
  w.CheckBlobs("priv.test/proj/a", w.a, kAlice);
  // B's layer asked for through A: refused although the node holds it and alice may pull A.
  HttpResponse blob = w.Get("priv.test/proj/a/blobs/" + w.b.layer_digests[0].str(), kAlice);
  CHECK(blob.status == 404);
  CHECK(blob.body.find("BLOB_UNKNOWN") != std::string::npos);
  CHECK(blob.body.find("not part of any image of priv.test/proj/a") != std::string::npos);
  CHECK(Sha256::Of(blob.body) != w.b.layer_digests[0]);
  CHECK(w.PullAuth("client", "not_in_repo") == 1);
  // B's manifest by digest through A: the cached copy is not A's, and upstream has no such
  // manifest in A.
  HttpResponse manifest =
      w.Get("priv.test/proj/a/manifests/" + w.b.manifest_digest.str(), kAlice);
  CHECK(manifest.status == 404);
  CHECK(manifest.body.find("MANIFEST_UNKNOWN") != std::string::npos);
}

TEST_CASE("private: deny refuses private repositories with 404 and node serves them to anyone") {
  World w;
  for (const std::string& authorization : {std::string(), kAlice}) {
    HttpResponse denied = w.Get("deny.test/proj/a/manifests/1", authorization);
    CHECK(denied.status == 404);
    CHECK(denied.body.find("NAME_UNKNOWN") != std::string::npos);
    CHECK(denied.body.find("pull_auth deny") != std::string::npos);
    CHECK(denied.Header("www-authenticate").empty());
    HttpResponse blob = w.Get("deny.test/proj/a/blobs/" + w.a.layer_digests[0].str(), authorization);
    CHECK(blob.status == 404);
    HttpResponse tags = w.Get("deny.test/proj/a/tags/list", authorization);
    CHECK(tags.status == 404);
  }
  CHECK(w.PullAuth("deny", "denied") == 6);
  // node: today's single-tenant behaviour, no credentials needed, no check upstream.
  HttpResponse node = w.Get("node.test/proj/a/manifests/1");
  CHECK(node.status == 200);
  CHECK(node.Header("docker-content-digest") == w.a.manifest_digest.str());
  w.CheckBlobs("node.test/proj/a", w.a, "");
  CHECK(w.agent->Metric("shoal_shim_pull_auth_total", {{"registry_mode", "node"}}) == 0);
  // Listings of a private repository follow the same rule in client mode.
  CHECK(IsChallenge(w.Get("priv.test/proj/a/tags/list")));
  HttpResponse tags = w.Get("priv.test/proj/a/tags/list", kAlice);
  CHECK(tags.status == 200);
  CHECK(tags.body.find("\"1\"") != std::string::npos);
}

TEST_CASE("private: a public repository in client mode is served without credentials") {
  World w;
  HttpResponse manifest = w.Get("pub.test/proj/pub/manifests/1");
  REQUIRE_MESSAGE(manifest.status == 200, (manifest.body + "\n" + w.agent->LogTail()));
  CHECK(manifest.Header("docker-content-digest") == w.pub.manifest_digest.str());
  CHECK(w.Get("pub.test/proj/pub/manifests/" + w.pub.manifest_digest.str()).status == 200);
  w.CheckBlobs("pub.test/proj/pub", w.pub, "");
  // Credentials the public registry knows nothing of do not matter either.
  CHECK(w.Get("pub.test/proj/pub/manifests/1", kWrong).status == 200);
  CHECK(w.PullAuth("client", "public") >= 6);
  // One anonymous check for the repository, whatever the number of requests.
  CHECK(w.agent->Metric("shoal_pull_auth_upstream_checks_total",
                        {{"credentials", "anonymous"}, {"result", "granted"}}) == 1);
  CHECK(w.agent->Metric("shoal_pull_auth_upstream_checks_total", {{"credentials", "client"}}) == 0);
}

TEST_CASE("private: ctr pulls through the shim with the right credentials and gets nothing from it without") {
  World w;
  auto containerd = Containerd::Start();
  REQUIRE_MESSAGE(containerd.has_value(), Why(containerd));
  Containerd& c = *containerd.value();
  const std::string hosts_dir = w.dir.Sub("certs.d");
  // hosts.toml from shoalctl: the shim as mirror, then server = https://priv.test, which does
  // not resolve here (as an upstream the node cannot reach).
  auto config = Shoalctl({"config", "containerd", "--agent", w.agent->HostPort(), "--registry",
                          "priv.test", "-o", hosts_dir});
  REQUIRE_MESSAGE(config.has_value(), Why(config));
  // The node has the image cached already.
  REQUIRE(w.Get("node.test/proj/a/manifests/1").status == 200);
  w.CheckBlobs("node.test/proj/a", w.a, "");
  const double blobs_before =
      w.agent->Metric("shoal_shim_requests_total", {{"route", "blob"}, {"code", "200"}});

  // Without credentials: the shim challenges, ctr has nothing to answer with and moves on to
  // server, which fails. The shim served no manifest and no blob of proj/a.
  auto anonymous = c.Ctr({"images", "pull", "--snapshotter", "native", "--hosts-dir", hosts_dir,
                          "priv.test/proj/a:1"},
                         std::chrono::seconds(120));
  CHECK_FALSE(anonymous.has_value());
  CHECK(w.PullAuth("client", "challenge") >= 1);
  CHECK(w.agent->Metric("shoal_shim_requests_total", {{"route", "manifest"}, {"code", "200"}}) ==
        1);  // the warm-up's only
  CHECK(w.agent->Metric("shoal_shim_requests_total", {{"route", "blob"}, {"code", "200"}}) ==
        blobs_before);
  CHECK_FALSE(c.ImageDigest("priv.test/proj/a:1").has_value());

  // With --user: the challenge is answered with alice's credentials, checked upstream, and the
  // whole image comes from the shim.
  auto pulled = c.Ctr({"images", "pull", "--snapshotter", "native", "--hosts-dir", hosts_dir,
                       "--user", "alice:s3cret", "priv.test/proj/a:1"},
                      std::chrono::seconds(120));
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail()));
  auto digest = c.ImageDigest("priv.test/proj/a:1");
  REQUIRE_MESSAGE(digest.has_value(), Why(digest));
  CHECK(digest.value() == w.a.manifest_digest.str());
  CHECK(w.PullAuth("client", "verified") >= 1);
  CHECK(w.agent->Metric("shoal_shim_requests_total", {{"route", "blob"}, {"code", "200"}}) >=
        blobs_before + 3);
  CHECK(w.agent->Log().find("s3cret") == std::string::npos);
}

}  // namespace shoal::testkit
