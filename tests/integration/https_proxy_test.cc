// The agent's HTTPS proxy mode (--https-proxy): the real dockerd, configured with
// `shoalctl config dockerd --proxy` (HTTPS_PROXY in its environment, the node CA in
// /etc/docker/certs.d/gcr.io/), pulls gcr.io/proj/img by its own name through the agent; curl
// checks termination, tunnels, --proxy-tunnel=deny and a malformed CONNECT.
#include <doctest/doctest.h>

#include <netdb.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <sstream>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "lib/core/sha256.h"

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

namespace fs = std::filesystem;

// A docker-registry standing for gcr.io behind a counting proxy, and an agent in proxy mode
// whose upstream map sends gcr.io there and refuses other registries.
struct ProxyWorld {
  TempDir dir{"shoal-https-proxy"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<Agent> agent;

  explicit ProxyWorld(std::vector<std::string> agent_args = {}) {
    auto up = CountedUpstream::Start();
    REQUIRE_MESSAGE(up.has_value(), Why(up));
    registry = std::move(up.value().registry);
    proxy = std::move(up.value().proxy);
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.upstreams = {"gcr.io=" + proxy->Url()};
    opts.extra_args = {"--unmapped", "error", "--https-proxy"};
    opts.extra_args.insert(opts.extra_args.end(), agent_args.begin(), agent_args.end());
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agent = std::move(a.value());
  }

  BuiltImage Push(const std::string& name, const std::string& tag, uint64_t seed) {
    ImageSpec spec;
    spec.layers.push_back(LayerSpec{Compression::kGzip, 12, {1ull << 20}, seed});
    spec.layers.push_back(LayerSpec{Compression::kGzip, 6, {}, seed + 1});
    std::string layout = dir.Sub("layout-" + std::to_string(seed));
    auto built = BuildImage(spec, layout, tag);
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    auto pushed = PushImage(*registry, layout, tag, name);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return built.value();
  }

  // The node CA's certificate from the admin API, written to a file.
  std::string FetchCa() const {
    auto got = HttpGet(agent->Url() + "/shoal/v1/proxy/ca.crt");
    REQUIRE(got.has_value());
    REQUIRE(got.value().status == 200);
    CHECK(got.value().body.find("-----BEGIN CERTIFICATE-----") != std::string::npos);
    CHECK(got.value().body.find("PRIVATE KEY") == std::string::npos);
    std::string path = dir.Sub("ca.crt");
    WriteFile(path, got.value().body);
    return path;
  }

  double Connects(const std::string& mode) const {
    return agent->Metric("shoal_proxy_connects_total", {{"mode", mode}});
  }
};

// curl with only the arguments given: no proxy settings from the environment.
Result<std::string> Curl(std::vector<std::string> args) {
  args.insert(args.begin(), {"curl", "-sS", "--max-time", "60"});
  return RunCommand(std::move(args), std::chrono::seconds(90),
                    {"HTTPS_PROXY=", "https_proxy=", "HTTP_PROXY=", "http_proxy=", "ALL_PROXY=",
                     "all_proxy=", "NO_PROXY=", "no_proxy="});
}

// Sends bytes to 127.0.0.1:port on a fresh connection and returns everything the server sends
// back until it closes the connection.
std::string RawExchange(uint16_t port, const std::string& bytes) {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket sock(ioc);
  boost::system::error_code ec;
  sock.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  REQUIRE_FALSE(ec);
  boost::asio::write(sock, boost::asio::buffer(bytes), ec);
  REQUIRE_FALSE(ec);
  std::string out;
  boost::asio::read(sock, boost::asio::dynamic_buffer(out), ec);
  return out;
}

uint16_t PortOf(const std::string& host_port) {
  return static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

// A CA file in /etc/docker/certs.d/<host>/: dockerd 20.10 has no setting for another certs.d
// and loads every *.crt there, so a unique name keeps concurrent runs apart. The destructor
// removes the file and the directories it created.
class DockerCertsFile {
 public:
  DockerCertsFile(const std::string& host, const std::string& ca_pem) {
    fs::path dir = fs::path("/etc/docker/certs.d") / host;
    for (fs::path p = dir; !fs::exists(p); p = p.parent_path()) created_.push_back(p);
    fs::create_directories(dir);
    std::random_device rd;
    path_ =
        (dir / ("shoal-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + ".crt"))
            .string();
    WriteFile(path_, ca_pem);
  }
  ~DockerCertsFile() {
    std::error_code ec;
    fs::remove(path_, ec);
    for (const fs::path& p : created_) fs::remove(p, ec);  // only if empty; deepest first
  }
  DockerCertsFile(const DockerCertsFile&) = delete;
  DockerCertsFile& operator=(const DockerCertsFile&) = delete;

 private:
  std::string path_;
  std::vector<fs::path> created_;
};

// Whether host resolves to an address here.
bool Resolves(const std::string& host) {
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), "443", nullptr, &res);
  if (res) ::freeaddrinfo(res);
  return rc == 0;
}

size_t CountOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The value of NAME in a systemd drop-in's Environment="NAME=value" line; "" if absent.
std::string DropInEnv(const std::string& drop_in, const std::string& name) {
  std::istringstream in(drop_in);
  std::string line;
  const std::string prefix = "Environment=\"" + name + "=";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0 && line.size() > prefix.size() && line.back() == '"')
      return line.substr(prefix.size(), line.size() - prefix.size() - 1);
  }
  return "";
}

}  // namespace

TEST_CASE("proxy: dockerd pulls gcr.io/proj/img by its own name through the agent's HTTPS proxy") {
  ProxyWorld w;
  BuiltImage image = w.Push("proj/img", "1", 2101);

  // The configuration comes from the generator, as an operator would install it.
  const std::string out_dir = w.dir.Sub("dockerd-config");
  auto notes = Shoalctl({"config", "dockerd", "--proxy", "--agent", w.agent->HostPort(),
                         "--registry", "docker.io,gcr.io", "-o", out_dir});
  REQUIRE_MESSAGE(notes.has_value(), Why(notes));
  CHECK(notes.value().find("/etc/docker/certs.d/gcr.io/ca.crt") != std::string::npos);
  CHECK(notes.value().find("/shoal/v1/proxy/ca.crt") != std::string::npos);
  const std::string drop_in = ReadFile(out_dir + "/docker.service.d/shoal-proxy.conf");
  const std::string https_proxy = DropInEnv(drop_in, "HTTPS_PROXY");
  CHECK(https_proxy == w.agent->Url());

  DockerCertsFile trust("gcr.io", ReadFile(w.FetchCa()));
  // GODEBUG=netdns=go+2 makes Go log the host names it resolves (see the end of the test).
  auto dockerd =
      Dockerd::Start(ReadFile(out_dir + "/daemon.json"),
                     {"HTTPS_PROXY=" + https_proxy, "https_proxy=", "HTTP_PROXY=", "http_proxy=",
                      "NO_PROXY=", "no_proxy=", "ALL_PROXY=", "all_proxy=", "GODEBUG=netdns=go+2"});
  REQUIRE_MESSAGE(dockerd.has_value(), Why(dockerd));
  Dockerd& d = *dockerd.value();

  auto pulled = d.Docker({"pull", "gcr.io/proj/img:1"});
  REQUIRE_MESSAGE(pulled.has_value(),
                  (Why(pulled) + "\n" + w.agent->LogTail() + "\n" + d.LogTail()));
  auto digest = d.RepoDigest("gcr.io/proj/img:1");
  REQUIRE_MESSAGE(digest.has_value(), Why(digest));
  CHECK(digest.value() == image.manifest_digest.str());

  // Every blob crossed from upstream once, through the agent, over the terminated tunnel.
  CHECK(w.proxy->BlobBytes() == image.total_blob_bytes);
  CHECK(w.agent->Metric("shoal_shim_blob_bytes_total") >=
        static_cast<double>(image.total_blob_bytes));
  CHECK(w.Connects("terminate") >= 1);
  CHECK(w.Connects("tunnel") == 0);
  CHECK(w.Connects("denied") == 0);
  CHECK(w.agent->Metric("shoal_proxy_tls_handshake_failures_total") == 0);
  // dockerd dialled only the proxy and sent CONNECT gcr.io:443: gcr.io does not even resolve
  // on this machine, and the image exists only upstream of the agent. (dockerd 20.10 does look
  // the host up, for its insecure-registry CIDR check, and ignores the failure: those are the
  // "hostLookupOrder(gcr.io)" lines in its log.)
  WARN_FALSE(Resolves("gcr.io"));
  MESSAGE("dockerd's DNS lookups of gcr.io (insecure-registry check): ",
          CountOf(d.Log(), "hostLookupOrder(gcr.io)"));
}

TEST_CASE("proxy: a terminated CONNECT serves the registry API for the CONNECT host over TLS") {
  ProxyWorld w;
  BuiltImage image = w.Push("proj/img", "1", 2201);
  const std::string ca = w.FetchCa();
  const std::string proxy_url = w.agent->Url();
  // curl does not resolve gcr.io either: it sends CONNECT gcr.io:443 to the proxy.
  const std::string manifest_file = w.dir.Sub("manifest");
  auto got = Curl({"-f", "-x", proxy_url, "--cacert", ca, "-H", "Accept: " + image.media_type, "-o",
                   manifest_file, "https://gcr.io/v2/proj/img/manifests/1"});
  REQUIRE_MESSAGE(got.has_value(), (Why(got) + "\n" + w.agent->LogTail()));
  CHECK(Sha256File(manifest_file).value() == image.manifest_digest);
  // Blobs go out through TLS with pread + write, in several chunks, whole and verified.
  for (const Digest& layer : image.layer_digests) {
    const std::string blob_file = w.dir.Sub("blob-" + layer.hex());
    auto blob = Curl({"-f", "-x", proxy_url, "--cacert", ca, "-o", blob_file,
                      "https://gcr.io/v2/proj/img/blobs/" + layer.str()});
    REQUIRE_MESSAGE(blob.has_value(), (Why(blob) + "\n" + w.agent->LogTail()));
    CHECK(Sha256File(blob_file).value() == layer);
  }
  // A range of a cached blob, through TLS.
  auto part = Curl({"-f", "-x", proxy_url, "--cacert", ca, "-r", "10-19",
                    "https://gcr.io/v2/proj/img/blobs/" + image.layer_digests[0].str()});
  REQUIRE(part.has_value());
  CHECK(part.value().size() == 10);
  // Inside the tunnel only the registry API is served: no admin API, no metrics.
  auto admin = Curl({"-x", proxy_url, "--cacert", ca, "-o", "/dev/null", "-w", "%{http_code}",
                     "https://gcr.io/shoal/v1/proxy/ca.crt"});
  REQUIRE(admin.has_value());
  CHECK(admin.value() == "404");
  // A client that does not trust the node CA fails the handshake, which the agent counts.
  auto untrusted = Curl({"-f", "-x", proxy_url, "https://gcr.io/v2/"});
  CHECK_FALSE(untrusted.has_value());
  CHECK(WaitUntil([&] { return w.agent->Metric("shoal_proxy_tls_handshake_failures_total") == 1; },
                  std::chrono::seconds(10)));
  CHECK(w.agent->LogTail().find("TLS handshake for CONNECT gcr.io failed") != std::string::npos);
  CHECK(w.Connects("terminate") == static_cast<double>(image.layer_digests.size()) + 4);
  uint64_t layer_bytes = 0;
  for (uint64_t size : image.layer_sizes) layer_bytes += size;
  CHECK(w.proxy->BlobBytes() == layer_bytes);  // each layer once from upstream
}

TEST_CASE("proxy: a CONNECT outside the upstream map is tunnelled, and refused with deny") {
  ProxyWorld w;
  // The docker-registry itself stands for a host outside the map: 127.0.0.1:PORT.
  auto tunnelled = Curl({"-f", "-p", "-x", w.agent->Url(), w.registry->Url() + "/v2/"});
  REQUIRE_MESSAGE(tunnelled.has_value(),
                  (Why(tunnelled) + "\n" + w.agent->LogTail()));
  CHECK(tunnelled.value() == "{}");
  CHECK(w.Connects("tunnel") == 1);
  CHECK(w.Connects("terminate") == 0);
  // The agent only passed bytes: the registry was not asked through the agent's upstream side.
  CHECK(w.proxy->RequestLog().empty());

  ProxyWorld denying({"--proxy-tunnel", "deny"});
  auto refused = Curl({"-f", "-p", "-x", denying.agent->Url(), denying.registry->Url() + "/v2/"});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message.find("403") != std::string::npos);
  CHECK(denying.Connects("denied") == 1);
  CHECK(denying.Connects("tunnel") == 0);
  // Mapped registries are still terminated when tunnels are off.
  const std::string ca = denying.FetchCa();
  auto base = Curl({"-f", "-x", denying.agent->Url(), "--cacert", ca, "https://gcr.io/v2/"});
  REQUIRE_MESSAGE(base.has_value(), Why(base));
  CHECK(denying.Connects("terminate") == 1);
}

TEST_CASE("proxy: a malformed CONNECT gets 400, a dead target 502, and no proxy mode 405") {
  ProxyWorld w;
  const uint16_t port = PortOf(w.agent->HostPort());
  std::string no_port = RawExchange(port, "CONNECT gcr.io HTTP/1.1\r\nHost: gcr.io\r\n\r\n");
  CHECK(no_port.rfind("HTTP/1.1 400", 0) == 0);
  CHECK(no_port.find("CONNECT target \\\"gcr.io\\\" has no port") != std::string::npos);
  std::string junk = RawExchange(port, "CONNECT bad_host!:443 HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(junk.rfind("HTTP/1.1 400", 0) == 0);
  CHECK(junk.find("is not HOST:PORT") != std::string::npos);
  // A target nobody listens on: 502, without the address (client-visible errors name no
  // internal address; the agent's log does).
  const uint16_t closed = FreePort();
  std::string dead = RawExchange(
      port, "CONNECT 127.0.0.1:" + std::to_string(closed) + " HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(dead.rfind("HTTP/1.1 502", 0) == 0);
  CHECK(dead.find("cannot connect to <address>") != std::string::npos);
  CHECK(dead.find(std::to_string(closed)) == std::string::npos);

  // Without --https-proxy the shim is no proxy at all.
  TempDir dir("shoal-no-proxy");
  AgentOptions opts;
  opts.cache_dir = dir.Sub("cache");
  opts.upstreams = {"gcr.io=" + w.proxy->Url()};
  auto plain = Agent::Start(opts);
  REQUIRE_MESSAGE(plain.has_value(), Why(plain));
  std::string off = RawExchange(PortOf(plain.value()->HostPort()),
                                "CONNECT gcr.io:443 HTTP/1.1\r\nHost: gcr.io:443\r\n\r\n");
  CHECK(off.rfind("HTTP/1.1 405", 0) == 0);
  CHECK(off.find("--https-proxy") != std::string::npos);
  auto ca = HttpGet(plain.value()->Url() + "/shoal/v1/proxy/ca.crt");
  REQUIRE(ca.has_value());
  CHECK(ca.value().status == 404);
  CHECK_FALSE(fs::exists(dir.Sub("cache/proxy-ca")));
}

TEST_CASE("proxy: the node CA is created under the cache dir once and kept across restarts") {
  ProxyWorld w;
  const std::string ca_dir = w.dir.Sub("cache/proxy-ca");
  REQUIRE(fs::exists(ca_dir + "/ca.key"));
  CHECK((fs::status(ca_dir + "/ca.key").permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write));
  const std::string before = ReadFile(w.FetchCa());
  CHECK(before == ReadFile(ca_dir + "/ca.crt"));
  REQUIRE(w.agent->Restart().has_value());
  auto after = HttpGet(w.agent->Url() + "/shoal/v1/proxy/ca.crt");
  REQUIRE(after.has_value());
  CHECK(after.value().body == before);
}

}  // namespace shoal::testkit
