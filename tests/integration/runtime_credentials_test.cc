// Credentials at the shim: clients that present their own credentials are served with the
// agent's configured upstream credentials (from an upstream map file), and what the clients
// sent is neither logged nor forwarded upstream.
#include <doctest/doctest.h>

#include "lib/core/base64.h"
#include "lib/core/sha256.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/why.h"

namespace shoal::testkit {

TEST_CASE("runtime: client credentials are not logged and not forwarded in place of the map's") {
  TempDir dir("shoal-creds");
  RegistryOptions ro;
  ro.auth = RegistryOptions::Auth::kHtpasswd;  // alice:s3cret
  auto reg = Registry::Start(ro);
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 8, {}, 3001});
  auto built = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE(built.has_value());
  REQUIRE(PushImage(*reg.value(), dir.Sub("layout"), "1", "proj/private").has_value());

  // The upstream map file names gcr.io's endpoint and its credentials, docker config style.
  WriteFile(dir.Sub("map.json"), R"({"upstreams": {"gcr.io": {"url": ")" + reg.value()->Url() +
                                     R"(", "auth": ")" + Base64Encode("alice:s3cret") +
                                     R"("}}, "unmapped": "error"})");
  // Started by hand (not testkit::Agent) to read its whole log afterwards.
  auto agent = Process::Start(
      {SHOAL_AGENT_BIN, "--listen", "127.0.0.1:0", "--port-file", dir.Sub("port"), "--cache-dir",
       dir.Sub("cache"), "--log-level", "debug", "--upstream-map-file", dir.Sub("map.json")},
      dir.Sub("agent.log"));
  REQUIRE(agent.has_value());
  REQUIRE(WaitUntil([&] { return !ReadFile(dir.Sub("port")).empty() || !agent.value()->Running(); },
                    std::chrono::seconds(20)));
  REQUIRE_MESSAGE(agent.value()->Running(), agent.value()->LogTail());
  const std::string agent_url =
      "http://127.0.0.1:" + std::to_string(std::stoi(ReadFile(dir.Sub("port"))));
  REQUIRE(WaitForHttp(agent_url + "/v2/", std::chrono::seconds(20)));

  const std::string client_secret = "mallory-Pa55-client";
  const std::string client_token = "client-bearer-t0ken-xyz";
  const std::string basic = "Basic " + Base64Encode("mallory:" + client_secret);
  const std::string base = agent_url + "/v2/gcr.io/proj/private";
  // containerd-style (?ns=) and prefix-style requests, each with a client Authorization header.
  auto manifest = HttpRequest(
      "GET", base + "/manifests/1",
      {{"Authorization", basic}, {"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  REQUIRE(manifest.has_value());
  CHECK_MESSAGE(manifest.value().status == 200, manifest.value().body);
  CHECK(manifest.value().Header("docker-content-digest") == built.value().manifest_digest.str());
  for (const Digest& d : built.value().layer_digests) {
    auto blob = HttpRequest("GET", agent_url + "/v2/proj/private/blobs/" + d.str() + "?ns=gcr.io",
                            {{"Authorization", "Bearer " + client_token}});
    REQUIRE(blob.has_value());
    CHECK(blob.value().status == 200);
    CHECK(Sha256::Of(blob.value().body) == d);
  }
  // A token request with Basic credentials, as dockerd sends to a mirror's token realm: the shim
  // never issues a challenge, so there is no realm; the request is refused without a trace.
  auto token = HttpRequest("GET", agent_url + "/token?account=mallory&scope=repository:x:pull",
                           {{"Authorization", basic}});
  REQUIRE(token.has_value());
  CHECK(token.value().status == 404);
  auto ping = HttpRequest("GET", agent_url + "/v2/", {{"Authorization", basic}});
  CHECK(ping.value().status == 200);
  CHECK(ping.value().Header("www-authenticate").empty());

  // Upstream saw only alice (the map's credentials); mallory's never reached it.
  Registry& r = *reg.value();
  std::string upstream_log = ReadFile(r.LogPath());
  CHECK(upstream_log.find("alice") != std::string::npos);
  CHECK(upstream_log.find("mallory") == std::string::npos);
  CHECK(upstream_log.find(client_token) == std::string::npos);
  // Nothing the client sent, nor the configured password, is in the agent's (debug) log.
  std::string agent_log = agent.value()->Log();
  CHECK(agent_log.find("upstream map") != std::string::npos);
  for (const std::string& secret :
       {client_secret, client_token, Base64Encode("mallory:" + client_secret),
        std::string("s3cret"), Base64Encode("alice:s3cret")}) {
    CAPTURE(secret);
    CHECK(agent_log.find(secret) == std::string::npos);
  }
}

}  // namespace shoal::testkit
