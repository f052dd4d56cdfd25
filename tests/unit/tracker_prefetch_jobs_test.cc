// PrefetchJobs, the tracker's prefetch job store, with a fake clock: agent registration and
// expiry, node selection (all, names, labels, percentage), assignments, reports, deadlines and
// bounds.

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <variant>

#include "tracker/prefetch/prefetch_jobs.h"

namespace shoal::tracker {
namespace {

using std::chrono::seconds;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

PrefetchJobsOptions Options() {
  PrefetchJobsOptions o;
  o.agent_ttl = seconds(30);
  o.max_jobs = 3;
  o.keep_ended = seconds(600);
  o.max_agents = 8;
  return o;
}

PrefetchSpec Spec() {
  PrefetchSpec s;
  s.images = {"gcr.io/proj/app:1"};
  return s;
}

void Register(PrefetchJobs& jobs, const std::string& node,
              std::map<std::string, std::string> labels, TimePoint now = kT0) {
  REQUIRE_FALSE(jobs.Heartbeat(node, node + "-agent", std::move(labels), now, nullptr).has_value());
}

const PrefetchJobRecord& Created(std::variant<const PrefetchJobRecord*, PrefetchError> r) {
  REQUIRE_MESSAGE(std::holds_alternative<const PrefetchJobRecord*>(r),
                  std::get<PrefetchError>(r).message);
  return *std::get<const PrefetchJobRecord*>(r);
}

std::vector<std::string> Names(const PrefetchJobRecord& job) {
  std::vector<std::string> out;
  for (const auto& n : job.nodes) out.push_back(n.node);
  return out;
}

}  // namespace

TEST_CASE("prefetch jobs: an empty selection takes every live agent, silent ones are left out") {
  PrefetchJobs jobs(Options(), 1);
  Register(jobs, "n1", {});
  Register(jobs, "n2", {});
  Register(jobs, "old", {}, kT0 - seconds(31));
  const auto& job = Created(jobs.Create(Spec(), kT0));
  CHECK(Names(job) == std::vector<std::string>{"n1", "n2"});
  CHECK(jobs.LiveAgents(kT0).size() == 2);
}

TEST_CASE("prefetch jobs: selection by name, label selector and percentage") {
  std::vector<PrefetchAgent> live;
  for (int i = 0; i < 10; ++i) {
    std::string zone = i % 2 == 0 ? "a" : "b";
    live.push_back(PrefetchAgent{"node" + std::to_string(i), "x", {{"zone", zone}}, kT0});
  }
  PrefetchSpec s = Spec();
  s.selector = {{"zone", "b"}};
  CHECK(PrefetchJobs::Select(live, s) ==
        std::vector<std::string>{"node1", "node3", "node5", "node7", "node9"});
  s.selector = {{"zone", "b"}, {"gpu", "yes"}};
  CHECK(PrefetchJobs::Select(live, s).empty());

  // Names: live names must match the selector too; unknown names are kept (they fail later).
  s = Spec();
  s.nodes = {"node2", "ghost", "node3", "node2"};
  CHECK(PrefetchJobs::Select(live, s) == std::vector<std::string>{"ghost", "node2", "node3"});
  s.selector = {{"zone", "a"}};
  CHECK(PrefetchJobs::Select(live, s) == std::vector<std::string>{"ghost", "node2"});

  // Percentage: ceil(n * p / 100), deterministic, and a larger share only adds nodes.
  s = Spec();
  s.percent = 30;
  auto thirty = PrefetchJobs::Select(live, s);
  CHECK(thirty.size() == 3);
  CHECK(PrefetchJobs::Select(live, s) == thirty);
  s.percent = 60;
  auto sixty = PrefetchJobs::Select(live, s);
  CHECK(sixty.size() == 6);
  for (const auto& n : thirty) CHECK(std::find(sixty.begin(), sixty.end(), n) != sixty.end());
  s.percent = 1;
  CHECK(PrefetchJobs::Select(live, s).size() == 1);
  s.percent = 100;
  CHECK(PrefetchJobs::Select(live, s).size() == 10);
  // Percentage of a label selection.
  s.selector = {{"zone", "a"}};
  s.percent = 40;
  auto picked = PrefetchJobs::Select(live, s);
  CHECK(picked.size() == 2);
  for (const auto& n : picked) CHECK((n.back() - '0') % 2 == 0);
}

TEST_CASE("prefetch jobs: an empty selection is an error, an unknown named node fails at once") {
  PrefetchJobs jobs(Options(), 1);
  auto none = jobs.Create(Spec(), kT0);
  REQUIRE(std::holds_alternative<PrefetchError>(none));
  CHECK(std::get<PrefetchError>(none).code == PrefetchErrc::kNoNodes);
  CHECK(std::get<PrefetchError>(none).message.find("none of the 0 agents") != std::string::npos);

  Register(jobs, "n1", {});
  PrefetchSpec s = Spec();
  s.nodes = {"n1", "ghost"};
  const auto& job = Created(jobs.Create(s, kT0));
  REQUIRE(job.nodes.size() == 2);
  CHECK(job.nodes[0].node == "ghost");
  CHECK(job.nodes[0].state == PrefetchNodeState::kFailed);
  CHECK(job.nodes[0].error.find("no agent on node ghost") != std::string::npos);
  CHECK(job.nodes[1].state == PrefetchNodeState::kPending);
  CHECK_FALSE(job.ended);
}

TEST_CASE("prefetch jobs: a node takes its part once, reports progress, and the job ends") {
  PrefetchJobs jobs(Options(), 1);
  Register(jobs, "n1", {});
  Register(jobs, "n2", {});
  const std::string id = Created(jobs.Create(Spec(), kT0)).id;
  CHECK(jobs.HasPending("n1"));
  auto taken = jobs.Take("n1", "n1-agent", kT0);
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].id == id);
  CHECK(taken[0].images == Spec().images);
  CHECK(jobs.Take("n1", "n1-agent", kT0).empty());
  CHECK_FALSE(jobs.HasPending("n1"));

  PrefetchReport r;
  r.agent = "n1-agent";
  r.bytes_done = 10;
  r.bytes_total = 100;
  const uint64_t before = jobs.Find(id)->version;
  CHECK_FALSE(jobs.Report(id, "n1", r, kT0 + seconds(1)).has_value());
  CHECK(jobs.Find(id)->version > before);
  CHECK(jobs.Find(id)->nodes[0].bytes_done == 10);
  // Another agent cannot report on n1's part; nodes not in the job are unknown.
  PrefetchReport other = r;
  other.agent = "intruder";
  CHECK(jobs.Report(id, "n1", other, kT0)->code == PrefetchErrc::kConflict);
  CHECK(jobs.Report(id, "n9", r, kT0)->code == PrefetchErrc::kNotFound);
  CHECK(jobs.Report("pj-none", "n1", r, kT0)->code == PrefetchErrc::kNotFound);

  r.state = PrefetchNodeState::kDone;
  r.bytes_done = 100;
  CHECK_FALSE(jobs.Report(id, "n1", r, kT0 + seconds(2)).has_value());
  CHECK_FALSE(jobs.Find(id)->ended);
  // n2 reports without polling first (its part was pending): accepted.
  PrefetchReport r2;
  r2.agent = "n2-agent";
  r2.state = PrefetchNodeState::kFailed;
  r2.error = "manifest unknown";
  CHECK_FALSE(jobs.Report(id, "n2", r2, kT0 + seconds(3)).has_value());
  const PrefetchJobRecord* job = jobs.Find(id);
  REQUIRE(job->ended.has_value());
  CHECK_FALSE(job->ok);
  // An ended part takes no more reports.
  CHECK(jobs.Report(id, "n1", r, kT0 + seconds(4))->code == PrefetchErrc::kConflict);
}

TEST_CASE(
    "prefetch jobs: parts of silent agents fail, and a restarted agent's running part fails") {
  PrefetchJobs jobs(Options(), 1);
  Register(jobs, "n1", {});
  Register(jobs, "n2", {});
  const std::string id = Created(jobs.Create(Spec(), kT0)).id;
  REQUIRE(jobs.Take("n1", "n1-agent", kT0).size() == 1);
  // n2 keeps polling, n1 falls silent.
  Register(jobs, "n2", {}, kT0 + seconds(20));
  CHECK(jobs.Sweep(kT0 + seconds(29)).empty());
  auto changed = jobs.Sweep(kT0 + seconds(31));
  CHECK(changed == std::vector<std::string>{id});
  const PrefetchJobRecord* job = jobs.Find(id);
  CHECK(job->nodes[0].state == PrefetchNodeState::kFailed);
  CHECK(job->nodes[0].error.find("has not been heard from for 31 s") != std::string::npos);
  CHECK(job->nodes[1].state == PrefetchNodeState::kPending);

  // n2 takes its part, then comes back with a new agent id (a restart): the part fails.
  REQUIRE(jobs.Take("n2", "n2-agent", kT0 + seconds(32)).size() == 1);
  std::vector<std::string> restarted;
  REQUIRE_FALSE(jobs.Heartbeat("n2", "n2-agent-new", {}, kT0 + seconds(33), &restarted));
  CHECK(restarted == std::vector<std::string>{id});
  CHECK(jobs.Find(id)->nodes[1].error.find("restarted") != std::string::npos);
  CHECK(jobs.Find(id)->ended.has_value());
}

TEST_CASE("prefetch jobs: a job's deadline fails what is unfinished") {
  PrefetchJobs jobs(Options(), 1);
  Register(jobs, "n1", {});
  PrefetchSpec s = Spec();
  s.timeout = seconds(10);
  const std::string id = Created(jobs.Create(s, kT0)).id;
  Register(jobs, "n1", {}, kT0 + seconds(9));
  jobs.Sweep(kT0 + seconds(9));
  CHECK_FALSE(jobs.Find(id)->ended);
  Register(jobs, "n1", {}, kT0 + seconds(10));
  jobs.Sweep(kT0 + seconds(10));
  REQUIRE(jobs.Find(id)->ended.has_value());
  CHECK(jobs.Find(id)->nodes[0].error.find("timed out after 10 s") != std::string::npos);
}

TEST_CASE("prefetch jobs: bounds on jobs and agents, ended jobs expire") {
  PrefetchJobs jobs(Options(), 1);
  Register(jobs, "n1", {});
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(Created(jobs.Create(Spec(), kT0)).id);
  auto full = jobs.Create(Spec(), kT0);
  REQUIRE(std::holds_alternative<PrefetchError>(full));
  CHECK(std::get<PrefetchError>(full).code == PrefetchErrc::kFull);
  // Ending one makes room: the oldest ended job goes.
  jobs.Take("n1", "n1-agent", kT0);
  PrefetchReport done;
  done.agent = "n1-agent";
  done.state = PrefetchNodeState::kDone;
  CHECK_FALSE(jobs.Report(ids[1], "n1", done, kT0 + seconds(1)).has_value());
  const std::string fourth = Created(jobs.Create(Spec(), kT0 + seconds(2))).id;
  CHECK(jobs.Find(ids[1]) == nullptr);
  CHECK(jobs.job_count() == 3);
  // Ended jobs are kept keep_ended, then dropped.
  CHECK_FALSE(jobs.Report(ids[0], "n1", done, kT0 + seconds(3)).has_value());
  Register(jobs, "n1", {}, kT0 + seconds(500));
  jobs.Sweep(kT0 + seconds(500));
  CHECK(jobs.Find(ids[0]) != nullptr);
  Register(jobs, "n1", {}, kT0 + seconds(604));
  jobs.Sweep(kT0 + seconds(604));
  CHECK(jobs.Find(ids[0]) == nullptr);

  // Agents: at most max_agents; known ones keep polling.
  PrefetchJobs agents(Options(), 2);
  for (int i = 0; i < 8; ++i) Register(agents, "a" + std::to_string(i), {});
  auto err = agents.Heartbeat("a8", "x", {}, kT0, nullptr);
  REQUIRE(err.has_value());
  CHECK(err->code == PrefetchErrc::kFull);
  CHECK_FALSE(agents.Heartbeat("a0", "a0-agent", {}, kT0 + seconds(1), nullptr).has_value());
}

}  // namespace shoal::tracker
