// Real container runtimes from Debian pulling through one shoal-agent, each configured the way
// it expects a mirror: dockerd (registry-mirrors and a name prefix), containerd (hosts.toml,
// ?ns=), podman (a registries.conf mirror with a path prefix) and skopeo (a multi-arch index).
// The upstream is a local docker-registry behind a counting proxy, so every test can check that
// the image matches upstream digest for digest and that its blobs went through the agent.
#include <doctest/doctest.h>

#include <filesystem>

#include "lib/core/base64.h"

#include "tests/support/agent.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

// Two small gzip layers (one 1 MiB file): enough to see every blob cross, quick to unpack.
ImageSpec SmallImage(uint64_t seed) {
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 12, {1ull << 20}, seed});
  spec.layers.push_back(LayerSpec{Compression::kGzip, 6, {}, seed + 1});
  return spec;
}

// One docker-registry standing for both Docker Hub and gcr.io (library/... and proj/...), a
// counting proxy in front of it, and one agent whose upstream map sends docker.io and gcr.io
// to the proxy and refuses any other registry. Every runtime test uses this same agent
// configuration: the mirror modes need no per-client setup.
struct World {
  TempDir dir{"shoal-runtime"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<Agent> agent;

  World() {
    auto up = CountedUpstream::Start();
    REQUIRE_MESSAGE(up.has_value(), Why(up));
    registry = std::move(up.value().registry);
    proxy = std::move(up.value().proxy);
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.upstreams = {"docker.io=" + proxy->Url(), "gcr.io=" + proxy->Url()};
    opts.extra_args = {"--unmapped", "error"};
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agent = std::move(a.value());
  }

  // Builds an image and pushes it to the upstream as `name:tag` ("library/x", "proj/img").
  BuiltImage Push(const std::string& name, const std::string& tag, uint64_t seed) {
    std::string layout = dir.Sub("layout-" + std::to_string(seed));
    auto built = BuildImage(SmallImage(seed), layout, tag);
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    auto pushed = PushImage(*registry, layout, tag, name);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return built.value();
  }

  // Every blob of `image` crossed from upstream exactly once, through the agent, and the agent
  // sent at least that many blob bytes to its client.
  void CheckBlobsWentThroughAgent(uint64_t total_blob_bytes) const {
    CHECK(proxy->BlobBytes() == total_blob_bytes);
    double sent = agent->Metric("shoal_shim_blob_bytes_total");
    CHECK(sent >= static_cast<double>(total_blob_bytes));
  }

  // No client of this agent ever got a 5xx.
  void CheckNo5xx() const {
    std::string text = agent->Metrics();
    for (const char* code : {"500", "502", "503", "504"}) {
      CAPTURE(code);
      CHECK(MetricSum(text, "shoal_shim_requests_total", {{"code", code}}) == 0);
    }
  }
};

// Runs `shoalctl config <runtime> --agent AGENT --registry <registries> -o <dir>`: the tests
// configure every runtime with the generator's output, so the generator is tested for real.
std::string GenerateConfig(const World& w, const std::string& runtime,
                           const std::string& registries, const std::string& out_dir) {
  auto out = Shoalctl(
      {"config", runtime, "--agent", w.agent->HostPort(), "--registry", registries, "-o", out_dir});
  REQUIRE_MESSAGE(out.has_value(), Why(out));
  return out.value();
}

// daemon.json from `shoalctl config dockerd` (the test's Dockerd forces vfs and its own dirs).
std::string DaemonJson(const World& w) {
  std::string dir = w.dir.Sub("dockerd-config");
  std::string notes = GenerateConfig(w, "dockerd", "docker.io,gcr.io", dir);
  CHECK(notes.find("--serialize-image-pulls=false --image-pull-progress-deadline=30m") !=
        std::string::npos);
  CHECK(notes.find(w.agent->HostPort() + "/gcr.io/") != std::string::npos);
  std::string json = ReadFile(dir + "/daemon.json");
  CHECK(json.find("\"max-concurrent-downloads\": 10") != std::string::npos);
  return json;
}

}  // namespace

TEST_CASE("runtime: dockerd pulls a docker.io/library image through registry-mirrors") {
  World w;
  BuiltImage image = w.Push("library/hello", "1", 1001);
  auto dockerd = Dockerd::Start(DaemonJson(w));
  REQUIRE_MESSAGE(dockerd.has_value(), Why(dockerd));
  Dockerd& d = *dockerd.value();
  // The user is logged in to Docker Hub: the client hands these credentials to dockerd with the
  // pull. They must not reach the agent (it sends no challenge) nor its log.
  const std::string hub_secret = "hub-Pa55word-never-seen";
  d.WriteClientConfig(R"({"auths":{"https://index.docker.io/v1/":{"auth":")" +
                      Base64Encode("hubuser:" + hub_secret) + R"("}}})");

  auto pulled = d.Docker({"pull", "hello:1"});
  REQUIRE_MESSAGE(pulled.has_value(),
                  (Why(pulled) + "\n" + w.agent->LogTail() + "\n" + d.LogTail()));
  auto digest = d.RepoDigest("hello:1");
  REQUIRE_MESSAGE(digest.has_value(), Why(digest));
  CHECK(digest.value() == image.manifest_digest.str());
  w.CheckBlobsWentThroughAgent(image.total_blob_bytes);
  w.CheckNo5xx();
  // dockerd asked the mirror with Docker Hub's "library/" name and no registry prefix.
  CHECK(w.agent->Metric("shoal_shim_requests_total", {{"route", "manifest"}, {"code", "200"}}) >=
        1);
  std::string agent_log = w.agent->LogTail();
  CHECK(agent_log.find(hub_secret) == std::string::npos);
  CHECK(agent_log.find(Base64Encode("hubuser:" + hub_secret)) == std::string::npos);
}

TEST_CASE("runtime: dockerd pulls a gcr.io image through the name prefix HOST:PORT/gcr.io/...") {
  World w;
  BuiltImage image = w.Push("proj/img", "1", 1101);
  auto dockerd = Dockerd::Start(DaemonJson(w));
  REQUIRE_MESSAGE(dockerd.has_value(), Why(dockerd));
  Dockerd& d = *dockerd.value();

  const std::string ref = w.agent->HostPort() + "/gcr.io/proj/img:1";
  auto pulled = d.Docker({"pull", ref});
  REQUIRE_MESSAGE(pulled.has_value(),
                  (Why(pulled) + "\n" + w.agent->LogTail() + "\n" + d.LogTail()));
  auto digest = d.RepoDigest(ref);
  REQUIRE_MESSAGE(digest.has_value(), Why(digest));
  CHECK(digest.value() == image.manifest_digest.str());
  w.CheckBlobsWentThroughAgent(image.total_blob_bytes);
  w.CheckNo5xx();
}

TEST_CASE("runtime: containerd (ctr, hosts.toml, ?ns=) pulls a gcr.io image") {
  World w;
  BuiltImage image = w.Push("proj/img", "1", 1201);
  auto containerd = Containerd::Start();
  REQUIRE_MESSAGE(containerd.has_value(), Why(containerd));
  Containerd& c = *containerd.value();
  const std::string hosts_dir = w.dir.Sub("certs.d");
  GenerateConfig(w, "containerd", "gcr.io", hosts_dir);

  auto pulled = c.Pull(hosts_dir, "gcr.io/proj/img:1");
  REQUIRE_MESSAGE(pulled.has_value(),
                  (Why(pulled) + "\n" + w.agent->LogTail() + "\n" + c.LogTail()));
  auto digest = c.ImageDigest("gcr.io/proj/img:1");
  REQUIRE_MESSAGE(digest.has_value(), Why(digest));
  CHECK(digest.value() == image.manifest_digest.str());
  w.CheckBlobsWentThroughAgent(image.total_blob_bytes);
  w.CheckNo5xx();
}

TEST_CASE("runtime: podman pulls through a registries.conf mirror whose location has a path") {
  World w;
  BuiltImage image = w.Push("proj/img", "1", 1301);
  // The CRI-O drop-in serves podman as its whole registries.conf.
  GenerateConfig(w, "crio", "gcr.io,docker.io", w.dir.Sub("containers"));
  const std::string conf = w.dir.Sub("containers/50-shoal.conf");
  Podman podman;
  auto pulled = podman.Pull(conf, "gcr.io/proj/img:1");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail()));
  auto digest = podman.ImageDigest(conf, "gcr.io/proj/img:1");
  REQUIRE_MESSAGE(digest.has_value(), Why(digest));
  CHECK(digest.value() == image.manifest_digest.str());
  w.CheckBlobsWentThroughAgent(image.total_blob_bytes);
  w.CheckNo5xx();
}

TEST_CASE("runtime: skopeo copies a multi-arch OCI index with --all through the agent") {
  World w;
  std::string layout = w.dir.Sub("layout-multi");
  auto built = BuildIndex(DefaultMultiArchSpecs(), layout, "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  const BuiltImage& index = built.value();
  REQUIRE(index.platforms.size() == 2);
  auto pushed = PushImage(*w.registry, layout, "1", "proj/multi");
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));

  auto pulled = SkopeoCopyToLayout(w.agent->HostPort() + "/gcr.io/proj/multi:1", w.dir.Sub("out"));
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail()));
  CHECK(pulled.value().manifest_digest == index.manifest_digest);
  std::vector<Digest> children;
  for (const auto& p : index.platforms) children.push_back(p.manifest_digest);
  CHECK(pulled.value().child_manifests == children);
  // Both platforms' blobs (configs and layers) crossed once, through the agent.
  w.CheckBlobsWentThroughAgent(index.total_blob_bytes);
  w.CheckNo5xx();

  // A registry outside the upstream map gets a clear OCI error, in every mode.
  for (const std::string target :
       {"/v2/quay.io/proj/multi/manifests/1", "/v2/proj/multi/manifests/1?ns=quay.io"}) {
    CAPTURE(target);
    auto refused = HttpGet(w.agent->Url() + target);
    REQUIRE(refused.has_value());
    CHECK(refused.value().status == 404);
    CHECK(refused.value().body.find("NAME_UNKNOWN") != std::string::npos);
    // One text for every refused registry (which one is in the agent's log).
    CHECK(refused.value().body.find("registry not served: not in this agent's upstream map") !=
          std::string::npos);
  }
  auto inspect = Skopeo({"inspect", "--tls-verify=false",
                         "docker://" + w.agent->HostPort() + "/quay.io/proj/multi:1"},
                        std::chrono::seconds(60));
  REQUIRE_FALSE(inspect.has_value());
  CHECK(inspect.error().message.find("not in this agent's upstream map") != std::string::npos);
}

TEST_CASE("runtime: containerd's pull succeeds while upstream fails its first requests (503)") {
  World w;
  BuiltImage image = w.Push("proj/img", "1", 1401);
  auto containerd = Containerd::Start();
  REQUIRE_MESSAGE(containerd.has_value(), Why(containerd));
  Containerd& c = *containerd.value();
  const std::string hosts_dir = w.dir.Sub("certs.d");
  GenerateConfig(w, "containerd", "gcr.io", hosts_dir);

  // The agent retries with backoff (200 ms, 400 ms, ...) instead of passing 503s on, so the
  // runtime never falls back to the real registry (which it cannot reach here).
  w.proxy->FailNext(3, 503);
  auto pulled = c.Pull(hosts_dir, "gcr.io/proj/img:1");
  REQUIRE_MESSAGE(pulled.has_value(),
                  (Why(pulled) + "\n" + w.agent->LogTail() + "\n" + c.LogTail()));
  auto digest = c.ImageDigest("gcr.io/proj/img:1");
  REQUIRE(digest.has_value());
  CHECK(digest.value() == image.manifest_digest.str());
  int injected = 0;
  for (const auto& line : w.proxy->RequestLog())
    injected += line.find("-> 503") != std::string::npos;
  CHECK(injected == 3);
  w.CheckNo5xx();
}

}  // namespace shoal::testkit
