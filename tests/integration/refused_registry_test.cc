// No open connector (issue 14, item 4): for a registry its operator did not map, a real agent
// never connects to a loopback, private or other non-global address, whatever --unmapped says,
// and every refused registry gets the one same answer, so that the shim cannot be used as a port
// scanner into the node or the cluster. Mapped loopback registries still serve pulls.
#include <doctest/doctest.h>

#include <atomic>

#include <nlohmann/json.hpp>

#include "registry-shim/errors.h"
#include "tests/support/agent.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/sync_server.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

constexpr char kRefusedMetric[] = "shoal_shim_refused_registries_total";

// A TCP listener on 127.0.0.1 that only counts the connections it accepts (and closes them):
// what an open port on the node looks like to a connector.
struct CountingListener {
  std::atomic<int> accepted{0};
  std::unique_ptr<SyncHttpServer> server;

  CountingListener() {
    auto s = SyncHttpServer::StartRaw([this](boost::asio::ip::tcp::socket&) { ++accepted; });
    REQUIRE_MESSAGE(s.has_value(), Why(s));
    server = std::move(s.value());
  }
  std::string Port() const { return std::to_string(server->port()); }
};

// A docker-registry holding proj/app:1, a counting listener, and two agents that map gcr.io to
// that registry on loopback: one with --unmapped https, one with the default policy.
struct RefusalWorld {
  TempDir dir{"shoal-refused"};
  std::unique_ptr<Registry> registry;
  CountingListener listener;
  BuiltImage image;
  std::unique_ptr<Agent> https_agent;
  std::unique_ptr<Agent> default_agent;

  RefusalWorld() {
    auto reg = Registry::Start();
    REQUIRE_MESSAGE(reg.has_value(), Why(reg));
    registry = std::move(reg.value());
    ImageSpec spec;
    spec.layers.push_back(LayerSpec{Compression::kGzip, 5, {}, 41});
    auto built = BuildImage(spec, dir.Sub("layout"), "1");
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    image = built.value();
    auto pushed = PushImage(*registry, image.layout_dir, "1", "proj/app");
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    https_agent = StartAgent("https-cache", {"--unmapped", "https"});
    default_agent = StartAgent("default-cache", {});
  }

  std::unique_ptr<Agent> StartAgent(const std::string& cache, std::vector<std::string> args) {
    AgentOptions opts;
    opts.cache_dir = dir.Sub(cache);
    opts.upstreams = {"gcr.io=" + registry->Url()};
    opts.extra_args = std::move(args);
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    return std::move(a.value());
  }
};

struct Answer {
  int status = 0;
  std::string body;
};

Answer Ask(const Agent& agent, const std::string& method, const std::string& target) {
  auto r = HttpRequest(method, agent.Url() + target, {}, "", std::chrono::seconds(60));
  REQUIRE_MESSAGE(r.has_value(), (target + ": " + Why(r)));
  return Answer{r.value().status, r.value().body};
}

}  // namespace

TEST_CASE(
    "connector: unmapped loopback, private and unresolvable registries get one refusal and no "
    "connection") {
  RefusalWorld w;
  const std::string port = w.listener.Port();
  const std::string reg_port = std::to_string(w.registry->port());
  const std::string layer = w.image.layer_digests.at(0).str();

  // Under --unmapped https: IP literals (checked before any work) and names that resolve to
  // loopback or do not resolve (checked by the HTTP client), by ?ns= and by name prefix, for
  // manifests, blobs and listings. 127.0.0.1:<reg_port> is a real docker-registry, mapped only
  // as gcr.io: the map is by name, not by address.
  const std::vector<std::pair<std::string, std::string>> https_probes = {
      {"GET", "/v2/proj/app/manifests/1?ns=127.0.0.1:" + port},
      {"GET", "/v2/proj/app/manifests/1?ns=127.0.0.1:" + reg_port},
      {"GET", "/v2/127.0.0.1:" + port + "/proj/app/manifests/1"},
      {"GET", "/v2/127.0.0.1:" + reg_port + "/proj/app/blobs/" + layer},
      {"HEAD", "/v2/127.0.0.1:" + reg_port + "/proj/app/manifests/1"},
      {"GET", "/v2/proj/app/manifests/1?ns=10.1.2.3"},
      {"GET", "/v2/proj/app/manifests/1?ns=10.1.2.3:5000"},
      {"GET", "/v2/proj/app/manifests/1?ns=169.254.169.254"},
      {"GET", "/v2/proj/app/manifests/1?ns=%5B::1%5D:" + port},
      {"GET", "/v2/proj/app/manifests/1?ns=%5B::ffff:7f00:1%5D:" + port},
      {"GET", "/v2/proj/app/manifests/1?ns=%5Bfd00::1%5D:" + port},
      {"GET", "/v2/proj/app/tags/list?ns=127.0.0.1:" + port},
      {"GET", "/v2/proj/app/manifests/1?ns=localhost:" + port},
      {"GET", "/v2/localhost:" + port + "/proj/app/blobs/" + layer},
      {"GET", "/v2/proj/app/tags/list?ns=localhost:" + port},
      {"GET", "/v2/proj/app/manifests/1?ns=no-such-registry.invalid"},
  };
  // Under the default policy (error): a public name and a loopback one alike.
  const std::vector<std::pair<std::string, std::string>> default_probes = {
      {"GET", "/v2/proj/app/manifests/1?ns=quay.io"},
      {"GET", "/v2/quay.io/proj/app/blobs/" + layer},
      {"GET", "/v2/proj/app/manifests/1?ns=127.0.0.1:" + port},
  };

  const Answer first = Ask(*w.https_agent, "GET", https_probes[0].second);
  CHECK(first.status == 404);
  auto doc = nlohmann::json::parse(first.body, nullptr, false);
  REQUIRE_MESSAGE(!doc.is_discarded(), first.body);
  CHECK(doc["errors"][0]["code"] == "NAME_UNKNOWN");
  CHECK(doc["errors"][0]["message"] == std::string(shim::kRefusedRegistryMessage));
  CHECK(first.body.find(port) == std::string::npos);

  auto check_same = [&](const Agent& agent, const std::pair<std::string, std::string>& probe) {
    CAPTURE(probe.first);
    CAPTURE(probe.second);
    Answer a = Ask(agent, probe.first, probe.second);
    CHECK(a.status == first.status);
    if (probe.first == "GET") CHECK(a.body == first.body);
  };
  for (const auto& probe : https_probes) check_same(*w.https_agent, probe);
  for (const auto& probe : default_probes) check_same(*w.default_agent, probe);

  CHECK(w.listener.accepted.load() == 0);
  CHECK(w.https_agent->Metric(kRefusedMetric) == doctest::Approx(https_probes.size() + 1));
  CHECK(w.default_agent->Metric(kRefusedMetric) == doctest::Approx(default_probes.size()));
  // The operator's log says why, with the addresses the client's answer leaves out.
  const std::string log = w.https_agent->Log();
  CHECK(log.find("127.0.0.1:" + port + " is not in this agent's upstream map") !=
        std::string::npos);
  CHECK(log.find("is not a global address") != std::string::npos);
  CHECK(log.find("not connecting to") != std::string::npos);  // localhost: checked once resolved
  CHECK(log.find("no-such-registry.invalid") != std::string::npos);

  // The mapped loopback registry still serves, by name prefix (skopeo) and by ?ns= (curl).
  for (Agent* agent : {w.https_agent.get(), w.default_agent.get()}) {
    auto pulled = SkopeoCopyToLayout(agent->HostPort() + "/gcr.io/proj/app:1",
                                     w.dir.Sub("pulled-" + std::to_string(agent->pid())));
    REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
    CHECK(pulled.value().manifest_digest == w.image.manifest_digest);
    CHECK(pulled.value().layer_digests == w.image.layer_digests);
    auto curl = RunCommand({"curl", "-fsS", "-o", "/dev/null", "-w", "%{http_code}",
                            agent->Url() + "/v2/proj/app/blobs/" + layer + "?ns=gcr.io"});
    REQUIRE_MESSAGE(curl.has_value(), Why(curl));
    CHECK(curl.value() == "200");
  }
  CHECK(w.listener.accepted.load() == 0);
}

}  // namespace shoal::testkit
