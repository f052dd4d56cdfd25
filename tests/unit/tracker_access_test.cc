// tracker/access.*: which role each route needs, the verdicts for missing, invalid and
// wrong-role tokens, announce keys in the path; tracker/rate_limit.*: the bad-report limit.

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <prometheus/registry.h>

#include "lib/auth/tokens.h"
#include "tracker/access.h"
#include "tracker/rate_limit.h"

namespace shoal::tracker {
namespace {

namespace http = boost::beast::http;
using V = Access::Verdict;
const std::string kAgent = "agent-token-0123456789";
const std::string kOperator = "operator-token-0123456789";

struct Files {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("shoal-access-" + std::to_string(::getpid()));
  std::string agents = (dir / "agents").string();
  std::string operators = (dir / "operators").string();
  Files() {
    std::filesystem::create_directories(dir);
    std::ofstream(agents) << kAgent << "\n";
    std::ofstream(operators) << kOperator << "\n";
  }
  ~Files() { std::filesystem::remove_all(dir); }
};

}  // namespace

TEST_CASE("tracker access: each route needs the role that may call it") {
  CHECK(RequiredRole(http::verb::get, "/healthz") == Role::kAnyone);
  CHECK(RequiredRole(http::verb::get, "/metrics") == Role::kAnyone);
  CHECK(RequiredRole(http::verb::get, "/") == Role::kAnyone);
  CHECK(RequiredRole(http::verb::get, "/announce") == Role::kAgent);
  CHECK(RequiredRole(http::verb::get, "/scrape") == Role::kAgent);
  CHECK(RequiredRole(http::verb::post, "/v1/announces") == Role::kAgent);
  CHECK(RequiredRole(http::verb::post, "/v1/blobs/sha256:ab") == Role::kAgent);
  CHECK(RequiredRole(http::verb::post, "/v1/blobs/sha256:ab/chunks/0/bad") == Role::kAgent);
  CHECK(RequiredRole(http::verb::put, "/v1/manifests/sha256:ab") == Role::kAgent);
  CHECK(RequiredRole(http::verb::post, "/v1/manifests/resolve") == Role::kAgent);
  CHECK(RequiredRole(http::verb::post, "/v1/prefetch/poll") == Role::kAgent);
  CHECK(RequiredRole(http::verb::put, "/v1/prefetch/jobs/j1/nodes/n1") == Role::kAgent);
  CHECK(RequiredRole(http::verb::post, "/v1/prefetch/jobs") == Role::kOperator);
  CHECK(RequiredRole(http::verb::get, "/v1/prefetch/jobs") == Role::kOperator);
  CHECK(RequiredRole(http::verb::get, "/v1/prefetch/jobs/j1") == Role::kOperator);
  CHECK(RequiredRole(http::verb::get, "/v1/prefetch/agents") == Role::kOperator);
  CHECK(RequiredRole(http::verb::delete_, "/v1/prefetch/jobs/j1") == Role::kOperator);
}

TEST_CASE("tracker access: announce keys ride in the query") {
  CHECK(AnnounceKeyOf("auth=0123abcd&info_hash=x") == "0123abcd");
  CHECK(AnnounceKeyOf("info_hash=x&auth=k&port=1") == "k");
  CHECK(AnnounceKeyOf("info_hash=x&xauth=k").empty());
  CHECK(AnnounceKeyOf("").empty());
  CHECK(AnnounceKeyOf("auth=").empty());
}

TEST_CASE("tracker access: missing, invalid and wrong-role tokens are told apart") {
  Files f;
  prometheus::Registry registry;
  auto access = Access::Create({f.agents, f.operators, false}, registry);
  REQUIRE(access.has_value());
  Access& a = access.value();
  CHECK_FALSE(a.open());
  CHECK(a.Check(Role::kAnyone, "") == V::kAllowed);
  CHECK(a.Check(Role::kAgent, "") == V::kMissing);
  CHECK(a.Check(Role::kAgent, "Basic " + kAgent) == V::kMissing);
  CHECK(a.Check(Role::kAgent, "Bearer " + kAgent) == V::kAllowed);
  CHECK(a.Check(Role::kAgent, "bearer  " + kAgent + " ") == V::kAllowed);
  CHECK(a.Check(Role::kAgent, "Bearer nope-nope-nope-nope") == V::kInvalid);
  // Least privilege: an operator cannot publish, an agent cannot start cluster jobs.
  CHECK(a.Check(Role::kAgent, "Bearer " + kOperator) == V::kForbidden);
  CHECK(a.Check(Role::kOperator, "Bearer " + kAgent) == V::kForbidden);
  CHECK(a.Check(Role::kOperator, "Bearer " + kOperator) == V::kAllowed);
  CHECK(a.IsOperator("Bearer " + kOperator));
  CHECK_FALSE(a.IsOperator("Bearer " + kAgent));
  CHECK(a.CheckAnnounceKey(auth::AnnounceKey(kAgent)));
  CHECK_FALSE(a.CheckAnnounceKey(auth::AnnounceKey(kOperator)));
  CHECK_FALSE(a.CheckAnnounceKey(kAgent));
  CHECK(RefusalText(V::kMissing, Role::kOperator).find("operator token") != std::string::npos);
}

TEST_CASE("tracker access: without token files the tracker starts only when told to be open") {
  prometheus::Registry registry;
  auto closed = Access::Create({"", "", false}, registry);
  REQUIRE_FALSE(closed.has_value());
  CHECK(closed.error().message.find("--insecure-open") != std::string::npos);
  auto open = Access::Create({"", "", true}, registry);
  REQUIRE(open.has_value());
  CHECK(open.value().open());
  CHECK(open.value().Check(Role::kOperator, "") == V::kAllowed);
  CHECK(open.value().CheckAnnounceKey(""));
  auto unreadable = Access::Create({"/nonexistent/agents", "", false}, registry);
  CHECK(unreadable.error().code == ErrorCode::kIo);
}

TEST_CASE("tracker rate limit: a burst of per_minute, then one per 60/per_minute seconds") {
  RateLimit limit(6);
  const TimePoint t0 = TimePoint() + std::chrono::hours(1);
  for (int i = 0; i < 6; ++i) CHECK(limit.Allow("10.0.0.1", t0));
  CHECK_FALSE(limit.Allow("10.0.0.1", t0));
  CHECK(limit.Allow("10.0.0.2", t0));  // per key
  CHECK_FALSE(limit.Allow("10.0.0.1", t0 + std::chrono::seconds(9)));
  CHECK(limit.Allow("10.0.0.1", t0 + std::chrono::seconds(10)));
  CHECK_FALSE(limit.Allow("10.0.0.1", t0 + std::chrono::seconds(10)));
  // Bounded memory: with max_keys taken by busy keys, a new key is refused, not stored.
  RateLimit small(1, 2);
  CHECK(small.Allow("a", t0));
  CHECK(small.Allow("b", t0));
  CHECK_FALSE(small.Allow("c", t0));
  CHECK(small.Allow("c", t0 + std::chrono::minutes(2)));  // a and b are full again: forgotten
}

}  // namespace shoal::tracker
