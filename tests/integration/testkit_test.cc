// Proves the test kit itself: real docker-registry, generated images, skopeo round trips, the
// counting proxy and the token server.

#include <doctest/doctest.h>

#include <signal.h>

#include <filesystem>
#include <thread>

#include "lib/core/sha256.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/token_server.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

ImageSpec ThreeLayerSpec() {
  ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = Compression::kGzip, .small_files = 30, .seed = 11},
      LayerSpec{.compression = Compression::kGzip,
                .small_files = 5,
                .big_files = {3 << 20},
                .seed = 12,
                .with_whiteout = true},
      LayerSpec{.compression = Compression::kZstd, .small_files = 10, .seed = 13},
  };
  return spec;
}

TEST_CASE("testkit: process stops a daemon with SIGTERM and reports its status") {
  TempDir dir;
  auto p = Process::Start({"sleep", "60"}, dir.Sub("log"));
  REQUIRE(p.has_value());
  CHECK(p.value()->Running());
  CHECK(p.value()->Stop() == 128 + SIGTERM);
  CHECK_FALSE(p.value()->Running());
}

TEST_CASE("testkit: process start fails cleanly for a missing executable") {
  TempDir dir;
  auto p = Process::Start({"/nonexistent/shoal-binary"}, dir.Sub("log"));
  CHECK_FALSE(p.has_value());
}

TEST_CASE("testkit: run command returns output and fails on non-zero exit or timeout") {
  auto ok = RunCommand({"sh", "-c", "echo hello; echo err >&2"});
  REQUIRE(ok.has_value());
  CHECK(ok.value() == "hello\nerr\n");
  auto bad = RunCommand({"sh", "-c", "echo boom; exit 3"});
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().message.find("boom") != std::string::npos);
  auto slow = RunCommand({"sleep", "30"}, seconds(1));
  REQUIRE_FALSE(slow.has_value());
  CHECK(slow.error().message.find("timed out") != std::string::npos);
}

TEST_CASE("testkit: image builder is deterministic and its layout verifies") {
  TempDir dir;
  auto a = BuildImage(ThreeLayerSpec(), dir.Sub("a"), "1");
  auto b = BuildImage(ThreeLayerSpec(), dir.Sub("b"), "1");
  REQUIRE_MESSAGE(a.has_value(), Why(a));
  REQUIRE(b.has_value());
  CHECK(a.value().manifest_digest == b.value().manifest_digest);
  CHECK(a.value().layer_digests.size() == 3);
  auto blobs = LayoutBlobDigests(dir.Sub("a"));
  REQUIRE(blobs.has_value());
  CHECK(blobs.value().size() == 5);  // 3 layers + config + manifest
  auto layout = ReadLayout(dir.Sub("a"), "1");
  REQUIRE(layout.has_value());
  CHECK(layout.value().manifest_digest == a.value().manifest_digest);
  CHECK(layout.value().layer_digests == a.value().layer_digests);
}

TEST_CASE("testkit: umoci unpacks generated gzip and uncompressed layers with links") {
  TempDir dir;
  ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = Compression::kGzip, .small_files = 6, .seed = 21},
      LayerSpec{
          .compression = Compression::kNone, .small_files = 3, .seed = 22, .with_whiteout = true}};
  auto img = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  CHECK(img.value().diff_ids[1] == img.value().layer_digests[1]);
  // umoci (an independent OCI implementation; it has no zstd) unpacks it.
  auto unpack = RunCommand(
      {"umoci", "unpack", "--rootless", "--image", dir.Sub("layout") + ":1", dir.Sub("bundle")});
  REQUIRE_MESSAGE(unpack.has_value(), Why(unpack));
  std::string rootfs = dir.Sub("bundle") + "/rootfs";
  CHECK(std::filesystem::is_symlink(rootfs + "/links/symlink-21"));
  CHECK(std::filesystem::hard_link_count(rootfs + "/links/hardlink-22") == 2);
  CHECK(std::filesystem::exists(rootfs + "/opaque/kept-22"));
}

TEST_CASE("testkit: registry push and skopeo pull preserve every digest") {
  TempDir dir;
  auto reg = Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  auto img = BuildImage(ThreeLayerSpec(), dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  auto pushed = PushImage(*reg.value(), dir.Sub("layout"), "1", "demo/app");
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
  auto pulled = SkopeoCopyToLayout(reg.value()->HostPort() + "/demo/app:1", dir.Sub("out"));
  REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  CHECK(pulled.value().manifest_digest == img.value().manifest_digest);
  CHECK(pulled.value().layer_digests == img.value().layer_digests);
  CHECK(std::filesystem::exists(reg.value()->BlobDataPath(img.value().layer_digests[0])));
}

TEST_CASE("testkit: skopeo pulls through the counting proxy, which counts every blob byte") {
  TempDir dir;
  auto reg = Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  auto img = BuildImage(ThreeLayerSpec(), dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  REQUIRE(PushImage(*reg.value(), dir.Sub("layout"), "1", "demo/app").has_value());
  auto proxy = CountingProxy::Start(reg.value()->HostPort());
  REQUIRE(proxy.has_value());
  CountingProxy& p = *proxy.value();

  auto pulled = SkopeoCopyToLayout(p.HostPort() + "/demo/app:1", dir.Sub("out"));
  REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  CHECK(pulled.value().manifest_digest == img.value().manifest_digest);
  CHECK(pulled.value().layer_digests == img.value().layer_digests);
  CHECK(p.BlobBytes() == img.value().total_blob_bytes);
  for (const Digest& d : img.value().layer_digests) CHECK(p.BlobGets(d) == 1);
  CHECK(p.BlobGets(img.value().config_digest) == 1);
  CHECK(p.ManifestGets() >= 1);

  // Ranges and HEAD pass through with their headers.
  const Digest& layer = img.value().layer_digests[1];
  std::string url = p.Url() + "/v2/demo/app/blobs/" + layer.str();
  auto head = HttpRequest("HEAD", url);
  REQUIRE(head.has_value());
  CHECK(head.value().status == 200);
  CHECK(head.value().Header("content-length") == std::to_string(img.value().layer_sizes[1]));
  auto part = HttpGet(url, {{"Range", "bytes=10-19"}});
  REQUIRE(part.has_value());
  CHECK(part.value().status == 206);
  CHECK(part.value().body.size() == 10);
  CHECK(part.value().Header("content-range") ==
        "bytes 10-19/" + std::to_string(img.value().layer_sizes[1]));

  // Injected failures never reach the upstream.
  p.Reset();
  p.FailNext(2, 429);
  auto f1 = HttpGet(url);
  REQUIRE(f1.has_value());
  CHECK(f1.value().status == 429);
  CHECK(f1.value().Header("retry-after") == "1");
  CHECK(HttpGet(url).value().status == 429);
  auto ok = HttpGet(url);
  REQUIRE(ok.has_value());
  CHECK(ok.value().status == 200);
  CHECK(Sha256::Of(ok.value().body) == layer);
  CHECK(p.BlobBytes() == img.value().layer_sizes[1]);
  CHECK(p.Requests() == 3);

  // Upstream down: 502 rather than a hang.
  reg.value()->Stop();
  auto down = HttpGet(url);
  REQUIRE(down.has_value());
  CHECK(down.value().status == 502);
  // Back on the same port with the same storage.
  auto restarted = reg.value()->Restart();
  REQUIRE_MESSAGE(restarted.has_value(), Why(restarted));
  auto again = HttpGet(url);
  REQUIRE(again.has_value());
  CHECK(again.value().status == 200);
  CHECK(Sha256::Of(again.value().body) == layer);
}

TEST_CASE("testkit: the counting proxy throttles relayed bodies") {
  TempDir dir;
  auto reg = Registry::Start();
  REQUIRE(reg.has_value());
  ImageSpec spec;
  spec.layers = {LayerSpec{
      .compression = Compression::kNone, .small_files = 0, .big_files = {4 << 20}, .seed = 61}};
  auto img = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  REQUIRE(PushImage(*reg.value(), dir.Sub("layout"), "1", "demo/slow").has_value());
  auto proxy = CountingProxy::Start(reg.value()->HostPort());
  REQUIRE(proxy.has_value());
  proxy.value()->SetDelayPerMiB(milliseconds(100));
  auto start = std::chrono::steady_clock::now();
  auto r =
      HttpGet(proxy.value()->Url() + "/v2/demo/slow/blobs/" + img.value().layer_digests[0].str());
  auto elapsed = std::chrono::steady_clock::now() - start;
  REQUIRE(r.has_value());
  CHECK(r.value().status == 200);
  CHECK(elapsed >= milliseconds(350));
}

TEST_CASE("testkit: the counting proxy's rate limit is one link shared by all connections") {
  TempDir dir;
  auto reg = Registry::Start();
  REQUIRE(reg.has_value());
  ImageSpec spec;
  spec.layers = {LayerSpec{
      .compression = Compression::kNone, .small_files = 0, .big_files = {4 << 20}, .seed = 62}};
  auto img = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  REQUIRE(PushImage(*reg.value(), dir.Sub("layout"), "1", "demo/capped").has_value());
  auto proxy = CountingProxy::Start(reg.value()->HostPort());
  REQUIRE(proxy.has_value());
  proxy.value()->SetRateLimit(8 << 20);  // 8 MiB/s: one blob alone takes ~0.5 s
  const std::string url =
      proxy.value()->Url() + "/v2/demo/capped/blobs/" + img.value().layer_digests[0].str();
  auto start = std::chrono::steady_clock::now();
  Result<HttpResponse> a = MakeError(ErrorCode::kUnavailable, "not run");
  std::thread other([&] { a = HttpGet(url); });
  auto b = HttpGet(url);
  other.join();
  auto elapsed = std::chrono::steady_clock::now() - start;
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(a.value().status == 200);
  CHECK(b.value().status == 200);
  // Two blobs over one 8 MiB/s link: ~1 s (a burst of 256 KiB aside), not ~0.5 s each at once.
  CHECK(elapsed >= milliseconds(900));
}

TEST_CASE("testkit: an htpasswd registry needs the credentials to push and pull") {
  TempDir dir;
  RegistryOptions ro;
  ro.auth = RegistryOptions::Auth::kHtpasswd;
  auto reg = Registry::Start(ro);
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  ImageSpec spec;
  spec.layers = {LayerSpec{.small_files = 5, .seed = 31}};
  auto img = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  auto pushed = PushImage(*reg.value(), dir.Sub("layout"), "1", "team/private");
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
  std::string ref = reg.value()->HostPort() + "/team/private:1";
  auto anonymous = SkopeoCopyToLayout(ref, dir.Sub("anon"));
  CHECK_FALSE(anonymous.has_value());
  auto wrong = SkopeoCopyToLayout(ref, dir.Sub("wrong"), {"--src-creds", "alice:nope"});
  CHECK_FALSE(wrong.has_value());
  auto pulled = SkopeoCopyToLayout(ref, dir.Sub("out"), {"--src-creds", "alice:s3cret"});
  REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  CHECK(pulled.value().manifest_digest == img.value().manifest_digest);
  auto v2 = HttpGet(reg.value()->Url() + "/v2/");
  REQUIRE(v2.has_value());
  CHECK(v2.value().status == 401);
}

TEST_CASE("testkit: a token-protected registry works with real Bearer tokens") {
  TempDir dir;
  auto tokens = TokenServer::Start();
  REQUIRE_MESSAGE(tokens.has_value(), Why(tokens));
  auto reg = Registry::Start(tokens.value()->ForRegistry());
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  auto v2 = HttpGet(reg.value()->Url() + "/v2/");
  REQUIRE(v2.has_value());
  CHECK(v2.value().status == 401);
  CHECK(v2.value().Header("www-authenticate").find(tokens.value()->Realm()) != std::string::npos);

  ImageSpec spec;
  spec.layers = {LayerSpec{.small_files = 5, .seed = 41},
                 LayerSpec{.compression = Compression::kZstd, .small_files = 3, .seed = 42}};
  auto img = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  auto pushed = PushImage(*reg.value(), dir.Sub("layout"), "1", "team/tok");
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
  CHECK(tokens.value()->TokenRequests() >= 1);

  std::string ref = reg.value()->HostPort() + "/team/tok:1";
  uint64_t refused = tokens.value()->Refused();
  auto wrong = SkopeoCopyToLayout(ref, dir.Sub("wrong"), {"--src-creds", "alice:nope"});
  CHECK_FALSE(wrong.has_value());
  CHECK(tokens.value()->Refused() > refused);
  auto pulled = SkopeoCopyToLayout(ref, dir.Sub("out"), {"--src-creds", "alice:s3cret"});
  REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  CHECK(pulled.value().manifest_digest == img.value().manifest_digest);
  CHECK(pulled.value().layer_digests == img.value().layer_digests);

  // A hand-issued token opens the manifest endpoint directly.
  std::string token = tokens.value()->IssueToken("repository:team/tok:pull");
  auto manifest = HttpGet(reg.value()->Url() + "/v2/team/tok/manifests/1",
                          {{"Authorization", "Bearer " + token},
                           {"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  REQUIRE(manifest.has_value());
  CHECK(manifest.value().status == 200);
  CHECK(manifest.value().Header("docker-content-digest") == img.value().manifest_digest.str());
}

TEST_CASE("testkit: a multi-arch index round-trips through the registry") {
  TempDir dir;
  auto reg = Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  auto index = BuildIndex(DefaultMultiArchSpecs(), dir.Sub("layout"), "multi");
  REQUIRE_MESSAGE(index.has_value(), Why(index));
  REQUIRE(index.value().platforms.size() == 2);
  auto pushed = PushImage(*reg.value(), dir.Sub("layout"), "multi", "demo/multi");
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
  auto pulled = SkopeoCopyToLayout(reg.value()->HostPort() + "/demo/multi:multi", dir.Sub("out"));
  REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  CHECK(pulled.value().manifest_digest == index.value().manifest_digest);
  REQUIRE(pulled.value().child_manifests.size() == 2);
  CHECK(pulled.value().child_manifests[0] == index.value().platforms[0].manifest_digest);
  CHECK(pulled.value().child_manifests[1] == index.value().platforms[1].manifest_digest);
}

TEST_CASE("testkit: a pull-through registry serves an upstream registry's image") {
  TempDir dir;
  auto upstream = Registry::Start();
  REQUIRE(upstream.has_value());
  ImageSpec spec;
  spec.layers = {LayerSpec{.small_files = 5, .seed = 51}};
  auto img = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE(img.has_value());
  REQUIRE(PushImage(*upstream.value(), dir.Sub("layout"), "1", "library/app").has_value());
  RegistryOptions ro;
  ro.proxy_remote_url = upstream.value()->Url();
  auto cache = Registry::Start(ro);
  REQUIRE_MESSAGE(cache.has_value(), Why(cache));
  auto pulled = SkopeoCopyToLayout(cache.value()->HostPort() + "/library/app:1", dir.Sub("out"));
  REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  CHECK(pulled.value().manifest_digest == img.value().manifest_digest);
}

TEST_CASE("testkit: metric sums match label subsets of Prometheus text") {
  std::string text =
      "# HELP x_total things\n# TYPE x_total counter\n"
      "x_total{source=\"cache\",kind=\"blob\"} 10\n"
      "x_total{kind=\"blob\",source=\"upstream\"} 5.5\n"
      "x_total_other 100\n"
      "y 3\n";
  CHECK(MetricSum(text, "x_total") == doctest::Approx(15.5));
  CHECK(MetricSum(text, "x_total", {{"source", "cache"}}) == doctest::Approx(10));
  CHECK(MetricSum(text, "x_total", {{"source", "none"}}) == 0);
  CHECK(MetricSum(text, "y") == 3);
}

}  // namespace
}  // namespace shoal::testkit
