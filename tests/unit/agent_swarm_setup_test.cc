// The agent's swarm options from its flags: "auto" listen addresses and the peer CA rules.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "agent/swarm_setup.h"
#include "lib/tls/node_ca.h"

#include "tests/support/why.h"

namespace shoal::agent {
namespace {

http::Url TrackerAt(const std::string& url) { return http::Url::Parse(url).value(); }

}  // namespace

TEST_CASE("swarm setup: auto listens on the address this node reaches the tracker from") {
  auto loop = ResolveSwarmListen("auto:6881", TrackerAt("http://127.0.0.1:7000/"));
  REQUIRE_MESSAGE(loop.has_value(), Why(loop));
  CHECK(loop.value() == "127.0.0.1:6881");
  auto other_loop = ResolveSwarmListen("auto:0", TrackerAt("http://127.0.0.9:7000/"));
  REQUIRE(other_loop.has_value());
  CHECK(other_loop.value() == "127.0.0.1:0");  // the kernel's source address for 127.0.0.9
  CHECK(ResolveSwarmListen("10.1.2.3:6881", TrackerAt("http://127.0.0.1:7000/")).value() ==
        "10.1.2.3:6881");
  CHECK(ResolveSwarmListen("auto", TrackerAt("http://127.0.0.1:7000/")).error().code ==
        ErrorCode::kInvalidArgument);
  auto unresolvable = ResolveSwarmListen("auto:1", TrackerAt("http://no-such-host.invalid:7000/"));
  REQUIRE_FALSE(unresolvable.has_value());
  CHECK(unresolvable.error().code == ErrorCode::kUnavailable);
  CHECK(unresolvable.error().message.find("no-such-host.invalid") != std::string::npos);
}

TEST_CASE("swarm setup: peers need the cluster's peer CA unless --insecure-peers") {
  const http::Url tracker = TrackerAt("http://127.0.0.1:7000/");
  AgentConfig config;
  config.swarm_listen = "127.0.0.1:0";
  auto refused = MakeSwarmOptions(config, tracker, "a1");
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message.find("--insecure-peers") != std::string::npos);

  config.insecure_peers = true;
  auto plain = MakeSwarmOptions(config, tracker, "a1");
  REQUIRE(plain.has_value());
  CHECK_FALSE(plain.value().tls.has_value());

  char tmpl[] = "/tmp/shoal-swarm-setup-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  REQUIRE(tls::NodeCa::LoadOrCreate(dir + "/ca", "peer CA").has_value());
  config.peer_ca_cert = dir + "/ca/ca.crt";
  auto half = MakeSwarmOptions(config, tracker, "a1");
  REQUIRE_FALSE(half.has_value());
  CHECK(half.error().message.find("go together") != std::string::npos);
  config.peer_ca_key = dir + "/ca/ca.key";
  auto with_tls = MakeSwarmOptions(config, tracker, "a1");
  REQUIRE_MESSAGE(with_tls.has_value(), Why(with_tls));
  REQUIRE(with_tls.value().tls.has_value());
  CHECK_FALSE(with_tls.value().tls->cert_pem.empty());
  config.peer_ca_key = config.peer_ca_cert;  // a certificate is no key
  CHECK_FALSE(MakeSwarmOptions(config, tracker, "a1").has_value());
  std::filesystem::remove_all(dir);
}

}  // namespace shoal::agent
