#pragma once
// Who may call what on the tracker. Agents hold the cluster's agent token: announce and scrape
// (by the token's announce key in the query, /announce?auth=<key>), the blob and manifest APIs, and
// the agent side of prefetch (poll, report). Operators hold an operator token: prefetch jobs
// (create, list, watch), the agent list and the status page's detail. Nobody needs a token for
// /healthz, /metrics (aggregate counters only) and the status page's totals. Without token files
// the tracker runs open only when started with --insecure-open.

#include <array>
#include <optional>
#include <vector>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>
#include <boost/beast/http/verb.hpp>

#include "lib/auth/tokens.h"
#include "lib/core/error.h"

namespace shoal::tracker {

enum class Role { kAnyone, kAgent, kOperator };

// The role a request needs: path without the query, after an announce key was taken off it.
Role RequiredRole(boost::beast::http::verb method, std::string_view path);

// The announce key in an announce or scrape query ("auth=<key>"; libtorrent sends no headers
// and, on loopback, blocks any path but /announce), or empty.
std::string_view AnnounceKeyOf(std::string_view query);

struct AccessOptions {
  std::string agent_tokens_file;     // tokens agents present (one per line)
  std::string operator_tokens_file;  // tokens operators present
  bool insecure_open = false;        // no token files: everyone is agent and operator
};

// Not thread-safe: the server's network thread.
class Access {
 public:
  enum class Verdict { kAllowed, kMissing, kInvalid, kForbidden };

  // Reads the token files. Errors: kInvalidArgument when neither file nor insecure_open is
  // given, or as auth::ReadTokens.
  static Result<Access> Create(AccessOptions options, prometheus::Registry& registry);

  // Checks an Authorization header ("Bearer <token>") for `needed`.
  Verdict Check(Role needed, std::string_view authorization) const;
  // Checks an announce key for announce and scrape.
  bool CheckAnnounceKey(std::string_view key) const;
  // Whether authorization carries an operator token (or the tracker is open).
  bool IsOperator(std::string_view authorization) const;
  // Counts a refused request for route (metrics label) and reason.
  void CountRefused(std::string_view route, Verdict verdict);
  // Re-reads token files that changed (called from the upkeep timer).
  void Reload();
  bool open() const { return open_; }
  // The agent tokens' derived secrets (auth::TokenSet::derived_secrets), the current token's
  // first; empty for an open tracker. The same on every replica: UDP connection ids are keyed
  // with them.
  const std::vector<std::array<unsigned char, 32>>& agent_secrets() const;
  // "agent tokens: 2, operator tokens: 1" or "OPEN (--insecure-open)", for the startup log.
  std::string Describe() const;

 private:
  bool open_ = false;
  std::optional<auth::TokenSet> agents_;
  std::optional<auth::TokenSet> operators_;
  prometheus::Family<prometheus::Counter>* refused_ = nullptr;
};

// A short reason text for a refused request, naming what was missing (never a token).
std::string RefusalText(Access::Verdict verdict, Role needed);

}  // namespace shoal::tracker
