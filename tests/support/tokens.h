#pragma once
// The test cluster's credentials: one agent token and one operator token per test process,
// written to token files in a temp dir (removed at exit). The test kit's trackers accept them
// and its agents present the agent token, unless a test asks for --insecure-open.

#include <string>
#include <utility>
#include <vector>

namespace shoal::testkit {

struct ClusterTokens {
  std::string agent, op;                  // the tokens
  std::string agent_file, operator_file;  // files holding them
};

// The process's tokens (made on first use).
const ClusterTokens& Tokens();
// Header lists for HttpRequest: "Authorization: Bearer <agent token>" / "<operator token>".
std::vector<std::pair<std::string, std::string>> AgentAuth();
std::vector<std::pair<std::string, std::string>> OperatorAuth();
// A fresh random token (for rotation tests): 40 hex characters.
std::string NewToken();

}  // namespace shoal::testkit
