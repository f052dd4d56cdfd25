// The agent as a single-node caching pull-through mirror, driven by real skopeo against a real
// docker-registry, with upstream traffic measured by a counting proxy in between.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <openssl/evp.h>

#include "lib/core/base64.h"
#include "lib/core/sha256.h"
#include "tests/support/agent.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/token_server.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

// Three layers: small files (gzip), a 24 MiB file (gzip, several Range parts), zstd.
ImageSpec TestImage(uint64_t seed = 7) {
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 30, {}, seed});
  spec.layers.push_back(LayerSpec{Compression::kGzip, 5, {24ull << 20}, seed + 1});
  spec.layers.push_back(LayerSpec{Compression::kZstd, 40, {1ull << 20}, seed + 2});
  return spec;
}

// A registry with a test image pushed as demo/app:1, a counting proxy in front of it, and an
// agent whose docker.io upstream is the proxy.
struct World {
  TempDir dir{"shoal-shim"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<Agent> agent;
  BuiltImage image;

  explicit World(std::vector<std::string> agent_args = {"--part-size-mib", "4"}) {
    auto reg = Registry::Start();
    REQUIRE_MESSAGE(reg.has_value(), Why(reg));
    registry = std::move(reg.value());
    auto built = BuildImage(TestImage(), dir.Sub("layout"), "1");
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    image = built.value();
    auto pushed = PushImage(*registry, image.layout_dir, "1", "demo/app");
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    auto p = CountingProxy::Start(registry->HostPort());
    REQUIRE(p.has_value());
    proxy = std::move(p.value());
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.upstreams = {"docker.io=" + proxy->Url()};
    opts.extra_args = std::move(agent_args);
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agent = std::move(a.value());
  }

  Result<LayoutImage> Pull(const std::string& out_name, const std::string& ref = "demo/app:1") {
    return SkopeoCopyToLayout(agent->HostPort() + "/" + ref, dir.Sub(out_name));
  }

  void CheckSameAsUpstream(const LayoutImage& pulled) const {
    CHECK(pulled.manifest_digest == image.manifest_digest);
    CHECK(pulled.config_digest == image.config_digest);
    CHECK(pulled.layer_digests == image.layer_digests);
  }
};

}  // namespace

TEST_CASE("shim: skopeo pulls through the agent digest for digest, and the second pull is all cache") {
  World w;
  auto first = w.Pull("out1");
  REQUIRE_MESSAGE(first.has_value(), (Why(first) + "\n" + w.agent->LogTail()));
  w.CheckSameAsUpstream(first.value());
  // Every blob byte crossed from upstream exactly once, though the big layer came in parts.
  CHECK(w.proxy->BlobBytes() == w.image.total_blob_bytes);

  w.proxy->Reset();
  double cache_before = w.agent->Metric("shoal_shim_blob_bytes_total", {{"source", "cache"}});
  auto second = w.Pull("out2");
  REQUIRE_MESSAGE(second.has_value(), Why(second));
  w.CheckSameAsUpstream(second.value());
  CHECK(w.proxy->BlobBytes() == 0);
  double cache_after = w.agent->Metric("shoal_shim_blob_bytes_total", {{"source", "cache"}});
  CHECK(cache_after - cache_before == doctest::Approx(static_cast<double>(w.image.total_blob_bytes)));
}

TEST_CASE("shim: concurrent pulls of one image share one upstream fetch per blob") {
  World w({"--part-size-mib", "1024"});
  constexpr int kPulls = 4;
  std::vector<std::thread> threads;
  std::vector<Result<LayoutImage>> results(kPulls, MakeError(ErrorCode::kInternal, "not run"));
  for (int i = 0; i < kPulls; ++i) {
    threads.emplace_back([&, i] { results[i] = w.Pull("out" + std::to_string(i)); });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) {
    REQUIRE_MESSAGE(r.has_value(), Why(r));
    w.CheckSameAsUpstream(r.value());
  }
  for (const Digest& d : w.image.layer_digests) CHECK(w.proxy->BlobGets(d) == 1);
  CHECK(w.proxy->BlobGets(w.image.config_digest) == 1);
  CHECK(w.proxy->BlobBytes() == w.image.total_blob_bytes);
}

TEST_CASE("shim: a blob whose upstream bytes do not match its digest fails and is not cached") {
  World w;
  // Flip one byte in the middle of the big layer as stored by the registry (same size).
  const Digest& big = w.image.layer_digests[1];
  {
    std::fstream f(w.registry->BlobDataPath(big), std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekg(static_cast<std::streamoff>(w.image.layer_sizes[1] / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(w.image.layer_sizes[1] / 2));
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  auto pulled = w.Pull("out");
  CHECK_FALSE(pulled.has_value());
  // A direct GET never yields the complete body.
  auto direct = HttpGet(w.agent->Url() + "/v2/demo/app/blobs/" + big.str());
  if (direct.has_value()) {
    CHECK(direct.value().body.size() < w.image.layer_sizes[1]);
  }
  std::string cached = w.dir.Sub("cache") + "/blobs/sha256/" + big.hex().substr(0, 2) + "/" + big.hex();
  CHECK_FALSE(std::filesystem::exists(cached));
  CHECK(std::filesystem::is_empty(w.dir.Sub("cache") + "/tmp"));
  CHECK(w.agent->Metric("shoal_upstream_blob_fetches_total", {{"result", "digest_mismatch"}}) >= 1);
  CHECK(w.agent->Metric("shoal_shim_aborted_responses_total") >= 1);
}

TEST_CASE("shim: the cache survives an agent restart and tags still resolve when upstream is down") {
  World w;
  auto first = w.Pull("out1");
  REQUIRE_MESSAGE(first.has_value(), Why(first));
  REQUIRE(w.agent->Restart().has_value());
  w.proxy->Reset();
  auto second = w.Pull("out2");
  REQUIRE_MESSAGE(second.has_value(), (Why(second) + "\n" + w.agent->LogTail()));
  w.CheckSameAsUpstream(second.value());
  CHECK(w.proxy->BlobBytes() == 0);

  // Upstream gone: the tag resolves to the last known manifest, blobs come from the cache.
  w.registry->Stop();
  auto third = w.Pull("out3");
  REQUIRE_MESSAGE(third.has_value(), (Why(third) + "\n" + w.agent->LogTail()));
  w.CheckSameAsUpstream(third.value());
  auto by_digest = w.Pull("out4", "demo/app@" + w.image.manifest_digest.str());
  REQUIRE_MESSAGE(by_digest.has_value(), Why(by_digest));
}

TEST_CASE("shim: an htpasswd upstream is pulled with credentials from a docker config.json") {
  TempDir dir("shoal-auth");
  RegistryOptions ro;
  ro.auth = RegistryOptions::Auth::kHtpasswd;
  auto reg = Registry::Start(ro);
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  auto built = BuildImage(TestImage(11), dir.Sub("layout"), "1");
  REQUIRE(built.has_value());
  REQUIRE(PushImage(*reg.value(), dir.Sub("layout"), "1", "team/private").has_value());
  // Image references cannot carry a port after the first component, so the upstream map gives
  // the loopback registry a registry name.
  const std::string host = "registry.test";
  WriteFile(dir.Sub("config.json"),
            R"({"auths":{")" + host + R"(":{"auth":")" + Base64Encode("alice:s3cret") + R"("}}})");
  AgentOptions opts;
  opts.cache_dir = dir.Sub("cache");
  opts.upstreams = {host + "=" + reg.value()->Url()};
  opts.extra_args = {"--credentials", dir.Sub("config.json")};
  auto agent = Agent::Start(opts);
  REQUIRE_MESSAGE(agent.has_value(), Why(agent));
  // Name-prefix mode: the registry host is the first component of the name.
  auto pulled = SkopeoCopyToLayout(agent.value()->HostPort() + "/" + host + "/team/private:1",
                                   dir.Sub("out"));
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + agent.value()->LogTail()));
  CHECK(pulled.value().manifest_digest == built.value().manifest_digest);
  CHECK(pulled.value().layer_digests == built.value().layer_digests);
  // The credentials never reach the log.
  CHECK(agent.value()->LogTail(). find("s3cret") == std::string::npos);
}

TEST_CASE("shim: a Bearer-token upstream is pulled through the token flow") {
  TempDir dir("shoal-token");
  auto tokens = TokenServer::Start();
  REQUIRE_MESSAGE(tokens.has_value(), Why(tokens));
  auto reg = Registry::Start(tokens.value()->ForRegistry());
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  auto built = BuildImage(TestImage(21), dir.Sub("layout"), "1");
  REQUIRE(built.has_value());
  REQUIRE(PushImage(*reg.value(), dir.Sub("layout"), "1", "team/tok").has_value());
  const std::string host = "tokens.test";
  WriteFile(dir.Sub("config.json"),
            R"({"auths":{")" + host + R"(":{"username":"alice","password":"s3cret"}}})");
  AgentOptions opts;
  opts.cache_dir = dir.Sub("cache");
  opts.upstreams = {host + "=" + reg.value()->Url()};
  opts.extra_args = {"--credentials", dir.Sub("config.json")};
  auto agent = Agent::Start(opts);
  REQUIRE_MESSAGE(agent.has_value(), Why(agent));
  uint64_t tokens_before = tokens.value()->TokenRequests();
  auto pulled = SkopeoCopyToLayout(agent.value()->HostPort() + "/" + host + "/team/tok:1",
                                   dir.Sub("out"));
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + agent.value()->LogTail()));
  CHECK(pulled.value().manifest_digest == built.value().manifest_digest);
  CHECK(pulled.value().layer_digests == built.value().layer_digests);
  uint64_t used = tokens.value()->TokenRequests() - tokens_before;
  CHECK(used >= 1);
  // Tokens are cached per scope: far fewer token requests than upstream requests.
  CHECK(used <= 2);
}

TEST_CASE("shim: malformed requests get precise 4xx answers, never 5xx") {
  World w;
  const std::string base = w.agent->Url();
  auto code_of = [](const HttpResponse& r) {
    auto pos = r.body.find("\"code\":\"");
    return pos == std::string::npos ? std::string()
                                    : r.body.substr(pos + 8, r.body.find('"', pos + 8) - pos - 8);
  };
  struct Case {
    std::string method, target;
    std::vector<std::pair<std::string, std::string>> headers;
    int status;
    std::string code;
  };
  const Digest& big = w.image.layer_digests[1];
  std::string blob = "/v2/demo/app/blobs/" + big.str();
  std::vector<Case> cases = {
      {"GET", "/v2/Demo/App/manifests/1", {}, 400, "NAME_INVALID"},
      {"GET", "/v2/demo//app/manifests/1", {}, 400, "NAME_INVALID"},
      {"GET", "/v2/demo/app/manifests/bad!tag", {}, 404, "MANIFEST_UNKNOWN"},
      {"GET", "/v2/demo/app/manifests/sha256:1234", {}, 400, "DIGEST_INVALID"},
      {"GET", "/v2/demo/app/blobs/sha256:xyz", {}, 400, "DIGEST_INVALID"},
      {"GET", "/v2/demo/app/blobs/md5:abcd", {}, 400, "DIGEST_INVALID"},
      {"GET", "/v2/demo/app/blobs/notadigest", {}, 400, "DIGEST_INVALID"},
      {"GET", "/v2/demo/app/manifests/nope", {}, 404, "MANIFEST_UNKNOWN"},
      {"GET", "/v2/demo/app/blobs/sha256:" + std::string(64, '0'), {}, 404, "BLOB_UNKNOWN"},
      {"GET", blob, {{"Range", "bytes=abc"}}, 400, "RANGE_INVALID"},
      {"GET", blob, {{"Range", "bytes=99999999999-"}}, 416, "RANGE_INVALID"},
      {"POST", "/v2/demo/app/blobs/uploads/", {}, 405, "UNSUPPORTED"},
      {"GET", "/v2/demo/app/manifests/1?ns=evil%2F..%2Fhost", {}, 400, "NAME_INVALID"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.target);
    auto r = HttpRequest(c.method, base + c.target, c.headers);
    REQUIRE(r.has_value());
    CHECK(r.value().status == c.status);
    CHECK(code_of(r.value()) == c.code);
    CHECK(r.value().Header("content-type") == "application/json");
  }
  auto unsat = HttpRequest("GET", base + blob, {{"Range", "bytes=99999999999-"}});
  CHECK(unsat.value().Header("content-range") == "bytes */" + std::to_string(w.image.layer_sizes[1]));
}

TEST_CASE("shim: ranges, HEAD and headers follow the distribution spec") {
  World w;
  const Digest& big = w.image.layer_digests[1];
  const uint64_t size = w.image.layer_sizes[1];
  std::string url = w.agent->Url() + "/v2/demo/app/blobs/" + big.str();
  std::string upstream = ReadFile(w.image.layout_dir + "/blobs/sha256/" + big.hex());
  REQUIRE(upstream.size() == size);

  auto head = HttpRequest("HEAD", url);
  REQUIRE(head.has_value());
  CHECK(head.value().status == 200);
  CHECK(head.value().Header("content-length") == std::to_string(size));
  CHECK(head.value().Header("docker-content-digest") == big.str());
  CHECK(head.value().Header("accept-ranges") == "bytes");

  // A range of a blob that is still being fetched, then of the cached blob.
  for (int round = 0; round < 2; ++round) {
    auto part = HttpRequest("GET", url, {{"Range", "bytes=1000-2999"}});
    REQUIRE(part.has_value());
    CHECK(part.value().status == 206);
    CHECK(part.value().Header("content-range") == "bytes 1000-2999/" + std::to_string(size));
    CHECK(part.value().body == upstream.substr(1000, 2000));
    auto suffix = HttpRequest("GET", url, {{"Range", "bytes=-10"}});
    CHECK(suffix.value().body == upstream.substr(size - 10));
    WaitUntil([&] { return w.agent->Metric("shoal_upstream_blob_fetches_inflight") == 0; },
              std::chrono::seconds(30));
  }
  auto full = HttpGet(url);
  REQUIRE(full.has_value());
  CHECK(Sha256::Of(full.value().body) == big);

  auto manifest = HttpRequest("HEAD", w.agent->Url() + "/v2/demo/app/manifests/1",
                              {{"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  REQUIRE(manifest.has_value());
  CHECK(manifest.value().status == 200);
  CHECK(manifest.value().Header("docker-content-digest") == w.image.manifest_digest.str());
  CHECK(manifest.value().Header("content-type") == w.image.media_type);
  CHECK(manifest.value().Header("content-length") == std::to_string(w.image.manifest_json.size()));
  // A client that does not accept the manifest's type gets 404, as from docker-registry.
  auto refused = HttpRequest("GET", w.agent->Url() + "/v2/demo/app/manifests/1",
                             {{"Accept", "application/vnd.docker.distribution.manifest.v2+json"}});
  CHECK(refused.value().status == 404);
}

}  // namespace shoal::testkit
