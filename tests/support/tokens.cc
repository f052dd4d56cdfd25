#include "tests/support/tokens.h"

#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "lib/tls/node_ca.h"
#include "tests/support/process.h"

namespace shoal::testkit {

std::string NewToken() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 5; ++i) out += fmt::format("{:08x}", rd());
  return out;
}

const ClusterTokens& Tokens() {
  static std::unique_ptr<TempDir> dir;
  static ClusterTokens tokens = [] {
    dir = std::make_unique<TempDir>("shoal-tokens");
    ClusterTokens t{NewToken(), NewToken(), dir->Sub("agent-tokens"), dir->Sub("operator-tokens"),
                    dir->Sub("peer-ca/ca.crt"), dir->Sub("peer-ca/ca.key"), ""};
    std::ofstream(t.agent_file) << "# the test cluster's agent token\n" << t.agent << "\n";
    std::ofstream(t.operator_file) << t.op << "\n";
    auto ca = tls::NodeCa::LoadOrCreate(dir->Sub("peer-ca"), "shoal test cluster peer CA");
    if (!ca) throw std::runtime_error("test peer CA: " + ca.error().message);
    t.peer_ca_pem = ca.value()->cert_pem();
    return t;
  }();
  return tokens;
}

std::vector<std::pair<std::string, std::string>> AgentAuth() {
  return {{"Authorization", "Bearer " + Tokens().agent}};
}

std::vector<std::pair<std::string, std::string>> OperatorAuth() {
  return {{"Authorization", "Bearer " + Tokens().op}};
}

}  // namespace shoal::testkit
