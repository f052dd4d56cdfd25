#pragma once
// The test cluster's credentials: one agent token, one operator token and one peer CA per test
// process, written to files in a temp dir (removed at exit). The test kit's trackers accept the
// tokens and require chunk torrents of the peer CA; its agents present the agent token and mint
// their peer certificates from the CA, unless a test asks for --insecure-open/--insecure-peers.

#include <string>
#include <utility>
#include <vector>

namespace shoal::testkit {

struct ClusterTokens {
  std::string agent, op;                  // the tokens
  std::string agent_file, operator_file;  // files holding them
  std::string peer_ca_cert, peer_ca_key;  // the peer CA's PEM files (as the chart's Secret)
  std::string peer_ca_pem;                // its certificate as chunk torrents carry it
};

// The process's tokens (made on first use).
const ClusterTokens& Tokens();
// Header lists for HttpRequest: "Authorization: Bearer <agent token>" / "<operator token>".
std::vector<std::pair<std::string, std::string>> AgentAuth();
std::vector<std::pair<std::string, std::string>> OperatorAuth();
// A fresh random token (for rotation tests): 40 hex characters.
std::string NewToken();

}  // namespace shoal::testkit
