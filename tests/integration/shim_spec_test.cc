// Spec-exact answers (issue 13, item 8): each request goes to the shim (a real agent in front of
// a real docker-registry, distribution 2.8.2) and to that docker-registry directly, in the same
// test; status, OCI error code and the headers that matter must agree, or the difference is
// deliberate and said here (and in docs/runtimes.md, "Where the shim differs from
// docker-registry").
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "lib/core/content_hash.h"
#include "lib/core/sha256.h"
#include "lib/oci/media_types.h"
#include "tests/support/agent.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

constexpr char kRepo[] = "demo/app";

std::string Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

// The first OCI error code of a body, "" when it has none (docker-registry's router answers
// plain text).
std::string OciCode(const HttpResponse& r) {
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("errors") || !j["errors"].is_array() || j["errors"].empty() ||
      !j["errors"][0].contains("code")) {
    return "";
  }
  return j["errors"][0]["code"].get<std::string>();
}

std::string OciMessage(const HttpResponse& r) {
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("errors")) return "";
  return j["errors"][0].value("message", "");
}

// A registry with an agent whose docker.io upstream is a counting proxy in front of it, and
// helpers that send one request to either.
struct SpecWorld {
  TempDir dir{"shoal-spec"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<Agent> agent;

  SpecWorld() {
    auto reg = Registry::Start();
    REQUIRE_MESSAGE(reg.has_value(), Why(reg));
    registry = std::move(reg.value());
    auto p = CountingProxy::Start(registry->HostPort());
    REQUIRE(p.has_value());
    proxy = std::move(p.value());
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.upstreams = {"docker.io=" + proxy->Url()};
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agent = std::move(a.value());
  }

  HttpResponse Shim(const std::string& method, const std::string& path,
                    const Headers& headers = {}) {
    auto r = HttpRequest(method, agent->Url() + path, headers);
    REQUIRE_MESSAGE(r.has_value(), Why(r));
    return r.value();
  }
  HttpResponse Ref(const std::string& method, const std::string& path,
                   const Headers& headers = {}) {
    auto r = HttpRequest(method, registry->Url() + path, headers);
    REQUIRE_MESSAGE(r.has_value(), Why(r));
    return r.value();
  }

  // Monolithic upload of data under its digest in `algorithm`.
  Digest PushBlob(const std::string& data, DigestAlgorithm algorithm = DigestAlgorithm::kSha256) {
    Digest d = ContentHash::Of(algorithm, data);
    auto start = HttpRequest("POST", registry->Url() + "/v2/" + kRepo + "/blobs/uploads/");
    REQUIRE(start.has_value());
    REQUIRE(start.value().status == 202);
    std::string location = start.value().Header("location");
    if (location.rfind("http", 0) != 0) location = registry->Url() + location;
    location += (location.find('?') == std::string::npos ? "?" : "&") + ("digest=" + d.str());
    auto put = HttpRequest("PUT", location, {{"Content-Type", "application/octet-stream"}}, data);
    REQUIRE(put.has_value());
    REQUIRE_MESSAGE(put.value().status == 201, put.value().body);
    return d;
  }

  // PUT of a manifest under `ref`; returns the digest the registry names it by.
  Digest PutManifest(const std::string& ref, const std::string& body, std::string_view media_type) {
    auto put = HttpRequest("PUT", registry->Url() + "/v2/" + kRepo + "/manifests/" + ref,
                           {{"Content-Type", std::string(media_type)}}, body);
    REQUIRE(put.has_value());
    REQUIRE_MESSAGE(put.value().status == 201, put.value().body);
    return Sha256::Of(body);
  }

  // A schema2 image for one architecture: config + one layer; returns the manifest's digest.
  struct Pushed {
    Digest digest;
    std::string body;
  };
  Pushed PushSchema2(const std::string& tag, const std::string& arch, uint64_t seed) {
    const std::string config = nlohmann::json{{"architecture", arch},
                                              {"os", "linux"},
                                              {"rootfs", {{"type", "layers"}, {"diff_ids", {}}}}}
                                   .dump();
    const std::string layer = Bytes(64 << 10, seed);
    Digest c = PushBlob(config);
    Digest l = PushBlob(layer);
    nlohmann::json m = {
        {"schemaVersion", 2},
        {"mediaType", oci::kDockerManifestV2},
        {"config",
         {{"mediaType", oci::kDockerConfig}, {"size", config.size()}, {"digest", c.str()}}},
        {"layers",
         {{{"mediaType", oci::kDockerLayerGzip}, {"size", layer.size()}, {"digest", l.str()}}}}};
    std::string body = m.dump();
    return Pushed{PutManifest(tag, body, oci::kDockerManifestV2), body};
  }

  // An index (Docker list or OCI index) over the given children, tagged `tag`.
  Digest PushIndex(const std::string& tag, std::string_view media_type,
                   const std::vector<std::pair<Pushed, std::string>>& children) {
    nlohmann::json list = {{"schemaVersion", 2}, {"mediaType", media_type}, {"manifests", {}}};
    for (const auto& [child, arch] : children) {
      list["manifests"].push_back({{"mediaType", oci::kDockerManifestV2},
                                   {"size", child.body.size()},
                                   {"digest", child.digest.str()},
                                   {"platform", {{"architecture", arch}, {"os", "linux"}}}});
    }
    return PutManifest(tag, list.dump(), media_type);
  }

  std::string CachePath(const Digest& d) const {
    return dir.Sub("cache") + "/blobs/" + std::string(DigestAlgorithmName(d.algorithm())) + "/" +
           d.hex().substr(0, 2) + "/" + d.hex();
  }
};

}  // namespace

TEST_CASE(
    "spec: a syntactically invalid tag is an unknown manifest (404), as from docker-registry") {
  SpecWorld w;
  for (const std::string& tag : {std::string(".INVALID_MANIFEST_NAME"), std::string(129, 'a'),
                                 std::string("bad!tag"), std::string("-dash")}) {
    for (const char* method : {"GET", "HEAD"}) {
      CAPTURE(tag);
      CAPTURE(method);
      const std::string path = std::string("/v2/") + kRepo + "/manifests/" + tag;
      HttpResponse shim = w.Shim(method, path);
      HttpResponse ref = w.Ref(method, path);
      CHECK(ref.status == 404);
      CHECK(shim.status == 404);
      // docker-registry's router answers these with text/plain "404 page not found"; the shim
      // gives the spec's code for a manifest that does not exist (deliberate).
      if (std::string(method) == "GET") CHECK(OciCode(shim) == "MANIFEST_UNKNOWN");
    }
  }
  // No manifest can have such a tag: none of these asked upstream.
  CHECK(w.proxy->ManifestGets() == 0);
  // A valid tag of the longest length (128) that does not exist: the same answer, from upstream.
  const std::string longest = std::string("/v2/") + kRepo + "/manifests/" + std::string(128, 'a');
  HttpResponse shim = w.Shim("GET", longest);
  HttpResponse ref = w.Ref("GET", longest);
  CHECK(shim.status == 404);
  CHECK(ref.status == 404);
  CHECK(OciCode(shim) == "MANIFEST_UNKNOWN");
  CHECK(OciCode(ref) == "MANIFEST_UNKNOWN");
}

TEST_CASE("spec: a sha512 blob is served through the agent, verified with SHA-512 and cached") {
  SpecWorld w;
  const std::string data = Bytes(3 << 20, 5);
  const Digest d = w.PushBlob(data, DigestAlgorithm::kSha512);
  const std::string path = std::string("/v2/") + kRepo + "/blobs/" + d.str();

  HttpResponse ref_head = w.Ref("HEAD", path);
  HttpResponse shim_head = w.Shim("HEAD", path);
  CHECK(ref_head.status == 200);
  CHECK(shim_head.status == 200);
  CHECK(shim_head.Header("content-length") == ref_head.Header("content-length"));
  // docker-registry names the blob by the sha256 of its content; the shim by the digest asked
  // for (deliberate: the client asked by that digest, and it is what the agent verified).
  CHECK(ref_head.Header("docker-content-digest") == Sha256::Of(data).str());
  CHECK(shim_head.Header("docker-content-digest") == d.str());

  HttpResponse ref_get = w.Ref("GET", path);
  HttpResponse shim_get = w.Shim("GET", path);
  CHECK(ref_get.status == 200);
  REQUIRE(shim_get.status == 200);
  CHECK(shim_get.body == ref_get.body);
  CHECK(shim_get.body == data);
  // Verified and committed under blobs/sha512/.
  REQUIRE(
      WaitUntil([&] { return std::filesystem::exists(w.CachePath(d)); }, std::chrono::seconds(30)));
  CHECK(ReadFile(w.CachePath(d)) == data);

  // The second read is the cache's: no upstream request at all.
  w.proxy->Reset();
  HttpResponse again = w.Shim("GET", path);
  CHECK(again.status == 200);
  CHECK(again.body == data);
  CHECK(w.proxy->Requests() == 0);
  HttpResponse part = w.Shim("GET", path, {{"Range", "bytes=10-19"}});
  HttpResponse ref_part = w.Ref("GET", path, {{"Range", "bytes=10-19"}});
  CHECK(part.status == 206);
  CHECK(ref_part.status == 206);
  CHECK(part.body == ref_part.body);
  CHECK(part.Header("content-range") == ref_part.Header("content-range"));

  // Unknown and malformed sha512 digests, for blobs and manifests.
  struct Case {
    std::string path;
    int status;
    std::string code;
  };
  const std::string zeros = "sha512:" + std::string(128, '0');
  for (const Case& c :
       {Case{std::string("/v2/") + kRepo + "/blobs/" + zeros, 404, "BLOB_UNKNOWN"},
        Case{std::string("/v2/") + kRepo + "/blobs/sha512:abc", 400, "DIGEST_INVALID"},
        Case{std::string("/v2/") + kRepo + "/manifests/" + zeros, 404, "MANIFEST_UNKNOWN"}}) {
    CAPTURE(c.path);
    HttpResponse shim = w.Shim("GET", c.path);
    HttpResponse ref = w.Ref("GET", c.path);
    CHECK(ref.status == c.status);
    CHECK(OciCode(ref) == c.code);
    CHECK(shim.status == c.status);
    CHECK(OciCode(shim) == c.code);
  }
}

TEST_CASE(
    "spec: a sha512 blob whose upstream bytes do not match is never served whole nor cached") {
  SpecWorld w;
  const std::string data = Bytes(2 << 20, 9);
  const Digest d = w.PushBlob(data, DigestAlgorithm::kSha512);
  // docker-registry keeps the bytes under their sha256; flip one in the middle (same size).
  {
    std::fstream f(w.registry->BlobDataPath(Sha256::Of(data)),
                   std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekp(static_cast<std::streamoff>(data.size() / 2));
    char c = static_cast<char>(data[data.size() / 2] ^ 0x5a);
    f.write(&c, 1);
  }
  const std::string path = std::string("/v2/") + kRepo + "/blobs/" + d.str();
  // The reference registry does not verify on read: it serves the wrong bytes as a 200.
  HttpResponse ref = w.Ref("GET", path);
  CHECK(ref.status == 200);
  CHECK(ref.body.size() == data.size());
  CHECK(ref.body != data);
  // The agent hashes with SHA-512 and withholds the last byte: never the whole body.
  auto shim = HttpRequest("GET", w.agent->Url() + path);
  if (shim.has_value()) {
    CHECK((shim.value().status != 200 || shim.value().body.size() < data.size()));
  }
  CHECK(WaitUntil(
      [&] {
        return w.agent->Metric("shoal_upstream_blob_fetches_total",
                               {{"result", "digest_mismatch"}}) >= 1;
      },
      std::chrono::seconds(30)));
  CHECK_FALSE(std::filesystem::exists(w.CachePath(d)));
  CHECK(std::filesystem::is_empty(w.dir.Sub("cache") + "/tmp"));
}

TEST_CASE("spec: a Range of an unknown unit is ignored and the whole blob served (RFC 9110 14.2)") {
  SpecWorld w;
  const std::string data = Bytes(100 << 10, 3);
  const Digest d = w.PushBlob(data);
  const std::string path = std::string("/v2/") + kRepo + "/blobs/" + d.str();
  for (int round = 0; round < 2; ++round) {  // while fetching, then from the cache
    CAPTURE(round);
    HttpResponse shim = w.Shim("GET", path, {{"Range", "items=0-5"}});
    CHECK(shim.status == 200);
    CHECK(shim.body == data);
    CHECK(shim.Header("content-range").empty());
    WaitUntil([&] { return std::filesystem::exists(w.CachePath(d)); }, std::chrono::seconds(30));
  }
  // docker-registry (Go's net/http ServeContent) refuses it with 416, against RFC 9110's "MUST
  // ignore": a deliberate difference. HEAD, because its 416 body is shorter than the
  // Content-Length it announces.
  HttpResponse ref = w.Ref("HEAD", path, {{"Range", "items=0-5"}});
  CHECK(ref.status == 416);
  // A bytes range is the same on both.
  HttpResponse shim_part = w.Shim("GET", path, {{"Range", "bytes=0-5"}});
  HttpResponse ref_part = w.Ref("GET", path, {{"Range", "bytes=0-5"}});
  CHECK(shim_part.status == 206);
  CHECK(ref_part.status == 206);
  CHECK(shim_part.body == ref_part.body);
  CHECK(shim_part.Header("content-range") == ref_part.Header("content-range"));
}

TEST_CASE("spec: every 405 carries Allow, as a pull-only docker-registry mirror answers 405") {
  SpecWorld w;
  SpecWorld::Pushed image = w.PushSchema2("v1", "amd64", 1);
  // docker-registry in pull-through mode: the reference for a mirror that refuses pushes.
  RegistryOptions mirror_opts;
  mirror_opts.proxy_remote_url = w.registry->Url();
  auto mirror = Registry::Start(mirror_opts);
  REQUIRE_MESSAGE(mirror.has_value(), Why(mirror));
  const std::string blob = std::string("/v2/") + kRepo + "/blobs/" + Sha256::Of("x").str();
  const std::string manifest = std::string("/v2/") + kRepo + "/manifests/" + image.digest.str();
  struct Case {
    std::string method, path;
    bool mirror_sends_allow;  // its UNSUPPORTED 405s have none (RFC 9110 15.5.6 wants one)
  };
  for (const Case& c : {Case{"POST", std::string("/v2/") + kRepo + "/blobs/uploads/", false},
                        Case{"DELETE", manifest, false}, Case{"DELETE", blob, false},
                        Case{"PUT", blob, true}, Case{"PATCH", blob, true},
                        Case{"POST", std::string("/v2/") + kRepo + "/manifests/v1", true},
                        Case{"POST", std::string("/v2/") + kRepo + "/tags/list", true}}) {
    CAPTURE(c.method);
    CAPTURE(c.path);
    auto ref = HttpRequest(c.method, mirror.value()->Url() + c.path);
    REQUIRE(ref.has_value());
    HttpResponse shim = w.Shim(c.method, c.path);
    CHECK(ref.value().status == 405);
    CHECK(shim.status == 405);
    CHECK(ref.value().headers.count("allow") == (c.mirror_sends_allow ? 1u : 0u));
    REQUIRE(shim.headers.count("allow") == 1);
    CHECK(shim.Header("allow").find(c.method) == std::string::npos);
    if (c.path.find("/uploads/") == std::string::npos) CHECK(shim.Header("allow") == "GET, HEAD");
  }
  // OPTIONS: 200 with Allow on both.
  HttpResponse options = w.Shim("OPTIONS", manifest);
  auto ref_options = HttpRequest("OPTIONS", mirror.value()->Url() + manifest);
  REQUIRE(ref_options.has_value());
  CHECK(ref_options.value().status == 200);
  CHECK(options.status == 200);
  CHECK(options.Header("allow") == "GET, HEAD");
}

TEST_CASE("spec: tags/list and referrers are proxied, an unknown endpoint is not NAME_UNKNOWN") {
  SpecWorld w;
  SpecWorld::Pushed image = w.PushSchema2("v1", "amd64", 1);
  w.PushSchema2("v2", "amd64", 1);
  w.PushSchema2("v3", "amd64", 1);
  const std::string tags = std::string("/v2/") + kRepo + "/tags/list";
  auto sorted_tags = [](const HttpResponse& r) {
    auto j = nlohmann::json::parse(r.body);
    std::vector<std::string> t = j["tags"].get<std::vector<std::string>>();
    std::sort(t.begin(), t.end());
    return std::make_pair(j["name"].get<std::string>(), t);
  };
  {
    HttpResponse shim = w.Shim("GET", tags);
    HttpResponse ref = w.Ref("GET", tags);
    REQUIRE(ref.status == 200);
    REQUIRE(shim.status == 200);
    CHECK(sorted_tags(shim) == sorted_tags(ref));
    CHECK(shim.Header("content-type") == ref.Header("content-type"));
  }
  // n and last go upstream (docker-registry 2.8 ignores them; distribution 3 pages); ns does not.
  w.proxy->Reset();
  {
    HttpResponse shim = w.Shim("GET", tags + "?n=2&last=v1&ns=docker.io");
    HttpResponse ref = w.Ref("GET", tags + "?n=2&last=v1");
    REQUIRE(shim.status == 200);
    CHECK(sorted_tags(shim) == sorted_tags(ref));
    auto log = w.proxy->RequestLog();
    CHECK(std::count(log.begin(), log.end(), "GET " + tags + "?n=2&last=v1 -> 200") == 1);
  }
  // The Link of the next page, as a paginating upstream sends it (absolute, naming its own
  // host): rewritten to the shim's own path, the upstream host out, ns kept.
  w.proxy->AddResponseHeader("/tags/list", "Link",
                             "<http://{upstream}" + tags + "?last=v2&n=2>; rel=\"next\"");
  {
    HttpResponse shim = w.Shim("GET", tags + "?n=2");
    CHECK(shim.Header("link") == "<" + tags + "?last=v2&n=2>; rel=\"next\"");
    HttpResponse ns = w.Shim("GET", tags + "?n=2&ns=docker.io");
    CHECK(ns.Header("link") == "<" + tags + "?last=v2&n=2&ns=docker.io>; rel=\"next\"");
    CHECK(ns.Header("link").find(w.registry->HostPort()) == std::string::npos);
  }
  // A repository that does not exist: the same 404 NAME_UNKNOWN.
  {
    HttpResponse shim = w.Shim("GET", "/v2/nope/x/tags/list");
    HttpResponse ref = w.Ref("GET", "/v2/nope/x/tags/list");
    CHECK(ref.status == 404);
    CHECK(shim.status == 404);
    CHECK(OciCode(ref) == "NAME_UNKNOWN");
    CHECK(OciCode(shim) == "NAME_UNKNOWN");
  }
  // Referrers: asked upstream; docker-registry 2.8 has no referrers API and answers a plain 404,
  // which clients read as "use the tag schema". The repository exists: not NAME_UNKNOWN.
  {
    w.proxy->Reset();
    const std::string referrers = std::string("/v2/") + kRepo + "/referrers/" + image.digest.str();
    HttpResponse shim = w.Shim("GET", referrers);
    HttpResponse ref = w.Ref("GET", referrers);
    CHECK(ref.status == 404);
    CHECK(shim.status == 404);
    CHECK(OciCode(shim) != "NAME_UNKNOWN");
    auto log = w.proxy->RequestLog();
    CHECK(std::count(log.begin(), log.end(), "GET " + referrers + " -> 404") == 1);
    HttpResponse bad = w.Shim("GET", std::string("/v2/") + kRepo + "/referrers/sha256:xyz");
    CHECK(bad.status == 400);
    CHECK(OciCode(bad) == "DIGEST_INVALID");
  }
  // An endpoint that does not exist, of a repository that does.
  for (const std::string& path :
       {std::string("/v2/") + kRepo + "/whatever", std::string("/v2/") + kRepo + "/blobs/"}) {
    CAPTURE(path);
    HttpResponse shim = w.Shim("GET", path);
    HttpResponse ref = w.Ref("GET", path);
    CHECK(ref.status == 404);
    CHECK(shim.status == 404);
    CHECK(OciCode(shim) != "NAME_UNKNOWN");
  }
}

TEST_CASE(
    "spec: a schema2-only client gets a manifest list's linux/amd64 child, as from "
    "docker-registry, an OCI index is refused") {
  SpecWorld w;
  SpecWorld::Pushed arm = w.PushSchema2("arm", "arm64", 2);
  SpecWorld::Pushed amd = w.PushSchema2("amd", "amd64", 3);
  const Digest list =
      w.PushIndex("list", oci::kDockerManifestList, {{arm, "arm64"}, {amd, "amd64"}});
  const Digest arm_only = w.PushIndex("armonly", oci::kDockerManifestList, {{arm, "arm64"}});
  const Digest index = w.PushIndex("index", oci::kOciIndex, {{arm, "arm64"}, {amd, "amd64"}});
  const Headers schema2 = {{"Accept", std::string(oci::kDockerManifestV2)}};
  const std::string base = std::string("/v2/") + kRepo + "/manifests/";

  // By tag: the linux/amd64 image, with its own digest and type.
  for (const char* method : {"GET", "HEAD"}) {
    CAPTURE(method);
    HttpResponse shim = w.Shim(method, base + "list", schema2);
    HttpResponse ref = w.Ref(method, base + "list", schema2);
    REQUIRE(ref.status == 200);
    REQUIRE(shim.status == 200);
    CHECK(ref.Header("docker-content-digest") == amd.digest.str());
    CHECK(shim.Header("docker-content-digest") == ref.Header("docker-content-digest"));
    CHECK(shim.Header("content-type") == ref.Header("content-type"));
    CHECK(shim.Header("content-length") == ref.Header("content-length"));
    CHECK(shim.body == ref.body);
  }
  // By digest: the list itself (nothing else has that digest), on both.
  {
    HttpResponse shim = w.Shim("GET", base + list.str(), schema2);
    HttpResponse ref = w.Ref("GET", base + list.str(), schema2);
    CHECK(ref.status == 200);
    CHECK(shim.status == 200);
    CHECK(shim.Header("content-type") == std::string(oci::kDockerManifestList));
    CHECK(shim.Header("docker-content-digest") == ref.Header("docker-content-digest"));
  }
  // A client that accepts lists gets the list by tag.
  {
    const Headers lists = {{"Accept", std::string(oci::kDockerManifestList)}};
    HttpResponse shim = w.Shim("GET", base + "list", lists);
    HttpResponse ref = w.Ref("GET", base + "list", lists);
    CHECK(shim.Header("docker-content-digest") == list.str());
    CHECK(ref.Header("docker-content-digest") == list.str());
  }
  // No linux/amd64 image in the list; an OCI index (by tag or digest): 404 MANIFEST_UNKNOWN.
  for (const std::string& ref_text : {std::string("armonly"), std::string("index"), index.str()}) {
    CAPTURE(ref_text);
    HttpResponse shim = w.Shim("GET", base + ref_text, schema2);
    HttpResponse ref = w.Ref("GET", base + ref_text, schema2);
    CHECK(ref.status == 404);
    CHECK(shim.status == 404);
    CHECK(OciCode(ref) == "MANIFEST_UNKNOWN");
    CHECK(OciCode(shim) == "MANIFEST_UNKNOWN");
  }
  (void)arm_only;
}

TEST_CASE("spec: client-visible error messages name no upstream URL or address, the log does") {
  SpecWorld w;
  const std::vector<std::string> hidden = {w.registry->HostPort(), w.proxy->HostPort(), "http://",
                                           "127.0.0.1"};
  auto check_hidden = [&](const HttpResponse& r) {
    CAPTURE(r.body);
    CHECK_FALSE(OciMessage(r).empty());
    for (const auto& h : hidden) CHECK(r.body.find(h) == std::string::npos);
  };
  const std::string base = std::string("/v2/") + kRepo;
  HttpResponse manifest = w.Shim("GET", base + "/manifests/nope");
  CHECK(manifest.status == 404);
  CHECK(OciCode(manifest) == "MANIFEST_UNKNOWN");
  check_hidden(manifest);
  HttpResponse blob = w.Shim("GET", base + "/blobs/sha256:" + std::string(64, '1'));
  CHECK(blob.status == 404);
  CHECK(OciCode(blob) == "BLOB_UNKNOWN");
  check_hidden(blob);
  HttpResponse tags = w.Shim("GET", "/v2/nope/x/tags/list");
  check_hidden(tags);
  // Upstream unreachable: the connect error names the address it dialled.
  w.proxy->Stop();
  HttpResponse down = w.Shim("GET", base + "/manifests/other");
  CHECK(down.status == 503);
  check_hidden(down);
  HttpResponse down_tags = w.Shim("GET", base + "/tags/list");
  CHECK(down_tags.status == 503);
  check_hidden(down_tags);
  // The operator still sees where it failed.
  CHECK(w.agent->Log().find(w.proxy->HostPort()) != std::string::npos);
}

}  // namespace shoal::testkit
