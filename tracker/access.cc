#include "tracker/access.h"

#include <fmt/format.h>
#include <boost/algorithm/string/predicate.hpp>

#include "tracker/blobs/blob_api.h"
#include "tracker/cluster/cluster_view.h"
#include "tracker/manifests/manifest_api.h"
#include "tracker/prefetch/prefetch_api.h"
#include "tracker/swarms/batch.h"

namespace shoal::tracker {
namespace http = boost::beast::http;

namespace {

std::string_view VerdictName(Access::Verdict v) {
  switch (v) {
    case Access::Verdict::kAllowed:
      return "allowed";
    case Access::Verdict::kMissing:
      return "missing";
    case Access::Verdict::kInvalid:
      return "invalid";
    case Access::Verdict::kForbidden:
      return "forbidden";
  }
  return "invalid";
}

// The token of "Bearer <token>" (scheme case-insensitive), or empty.
std::string_view BearerToken(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !boost::iequals(authorization.substr(0, kScheme.size()), kScheme)) {
    return {};
  }
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  return token;
}

}  // namespace

Role RequiredRole(http::verb method, std::string_view path) {
  if (path == "/announce" || path == "/scrape" || path == kAnnounceBatchPath) return Role::kAgent;
  if (BlobApi::Owns(path) || ManifestApi::Owns(path)) return Role::kAgent;
  if (path == kClusterPath) return Role::kOperator;  // names images, nodes and agents
  if (PrefetchApi::Owns(path)) {
    // The agent side: polling for jobs, and reporting progress on one node's part.
    if (method == http::verb::post && path == "/v1/prefetch/poll") return Role::kAgent;
    constexpr std::string_view kJobs = "/v1/prefetch/jobs/";
    if (method == http::verb::put && path.substr(0, kJobs.size()) == kJobs &&
        path.find("/nodes/") != std::string_view::npos) {
      return Role::kAgent;
    }
    return Role::kOperator;
  }
  return Role::kAnyone;  // /healthz, /metrics, the status page's totals, /ui (no data), 404s
}

std::string_view AnnounceKeyOf(std::string_view query) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    if (param.substr(0, 5) == "auth=") return param.substr(5);
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {};
}

Result<Access> Access::Create(AccessOptions options, prometheus::Registry& registry) {
  Access a;
  a.refused_ = &prometheus::BuildCounter()
                    .Name("shoal_tracker_refused_requests_total")
                    .Help(
                        "Requests refused for their credential, by route and reason (missing, "
                        "invalid, forbidden: a valid token of the wrong role)")
                    .Register(registry);
  if (options.agent_tokens_file.empty() && options.operator_tokens_file.empty()) {
    if (!options.insecure_open) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "no --agent-tokens-file or --operator-tokens-file: the tracker would be "
                       "open to anyone who reaches it (tags rebound, private chunk tables read, "
                       "upstream re-fetches forced). Give token files, or --insecure-open for a "
                       "throwaway test tracker");
    }
    a.open_ = true;
    return a;
  }
  if (!options.agent_tokens_file.empty()) {
    auto set = auth::TokenSet::Load(options.agent_tokens_file);
    if (!set) return set.error();
    a.agents_ = std::move(set.value());
  }
  if (!options.operator_tokens_file.empty()) {
    auto set = auth::TokenSet::Load(options.operator_tokens_file);
    if (!set) return set.error();
    a.operators_ = std::move(set.value());
  }
  return a;
}

Access::Verdict Access::Check(Role needed, std::string_view authorization) const {
  if (open_ || needed == Role::kAnyone) return Verdict::kAllowed;
  std::string_view token = BearerToken(authorization);
  if (token.empty()) return Verdict::kMissing;
  bool agent = agents_ && agents_->Accepts(token);
  bool op = operators_ && operators_->Accepts(token);
  if ((needed == Role::kAgent && agent) || (needed == Role::kOperator && op)) {
    return Verdict::kAllowed;
  }
  return agent || op ? Verdict::kForbidden : Verdict::kInvalid;
}

bool Access::CheckAnnounceKey(std::string_view key) const {
  return open_ || (agents_ && agents_->AcceptsAnnounceKey(key));
}

bool Access::IsOperator(std::string_view authorization) const {
  return Check(Role::kOperator, authorization) == Verdict::kAllowed;
}

void Access::CountRefused(std::string_view route, Verdict verdict) {
  if (refused_ == nullptr) return;
  refused_->Add({{"route", std::string(route)}, {"reason", std::string(VerdictName(verdict))}})
      .Increment();
}

const std::vector<std::array<unsigned char, 32>>& Access::agent_secrets() const {
  static const std::vector<std::array<unsigned char, 32>> kNone;
  return agents_ ? agents_->derived_secrets() : kNone;
}

void Access::Reload() {
  if (agents_) agents_->Reload();
  if (operators_) operators_->Reload();
}

std::string Access::Describe() const {
  if (open_) return "OPEN to anyone who reaches it (--insecure-open)";
  return fmt::format("agent tokens: {}, operator tokens: {}", agents_ ? agents_->size() : 0,
                     operators_ ? operators_->size() : 0);
}

std::string RefusalText(Access::Verdict verdict, Role needed) {
  std::string_view who = needed == Role::kOperator ? "an operator" : "an agent";
  switch (verdict) {
    case Access::Verdict::kMissing:
      return fmt::format("this tracker needs {} token: send Authorization: Bearer <token>", who);
    case Access::Verdict::kInvalid:
      return "the token is not valid for this tracker";
    case Access::Verdict::kForbidden:
      return fmt::format("this route needs {} token; the token given has another role", who);
    case Access::Verdict::kAllowed:
      break;
  }
  return "";
}

}  // namespace shoal::tracker
