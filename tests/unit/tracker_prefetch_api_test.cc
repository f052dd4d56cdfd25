// PrefetchApi without the network: request validation (400 with precise messages), routes,
// status mapping and the JSON answers (HandleNow; long-polls are covered by
// tests/integration/prefetch_test.cc).

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <utility>

#include <prometheus/registry.h>
#include <nlohmann/json.hpp>

#include "tracker/prefetch/prefetch_api.h"

namespace shoal::tracker {
namespace {

using nlohmann::json;
using std::chrono::seconds;
namespace http = boost::beast::http;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

struct Api {
  prometheus::Registry registry;
  PrefetchApi api{PrefetchApiOptions{}, registry, "0123456789abcdef", 7};

  std::pair<unsigned, json> Call(http::verb method, std::string_view path, std::string_view query,
                                 std::string_view body, TimePoint now = kT0) {
    BlobResponse r = api.HandleNow(BlobRequest{method, path, query, body}, now);
    json j = json::parse(r.body, nullptr, false);
    REQUIRE_MESSAGE(j.is_object(), r.body);
    CHECK(j.value("tracker_id", "") == "0123456789abcdef");
    return {r.status, j};
  }
  std::string Error(http::verb method, std::string_view path, std::string_view body,
                    unsigned want = 400) {
    // No structured bindings here: clang 14 cannot capture them in doctest's _MESSAGE lambdas.
    auto reply = Call(method, path, "", body);
    CHECK_MESSAGE(reply.first == want, reply.second.dump());
    return reply.second.value("error", "");
  }
  void Poll(const std::string& node, const std::string& labels = "{}") {
    auto reply =
        Call(http::verb::post, "/v1/prefetch/poll", "",
             R"({"agent":")" + node + R"(-a","node":")" + node + R"(","labels":)" + labels + "}");
    REQUIRE_MESSAGE(reply.first == 200, reply.second.dump());
  }
};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("prefetch api: malformed job requests get 400 with a precise message") {
  Api a;
  const auto post = http::verb::post;
  const std::string_view jobs = "/v1/prefetch/jobs";
  CHECK(Contains(a.Error(post, jobs, ""), "request body is empty"));
  CHECK(Contains(a.Error(post, jobs, "{"), "not valid JSON"));
  CHECK(Contains(a.Error(post, jobs, "[]"), "not a JSON object"));
  CHECK(Contains(a.Error(post, jobs, "{}"), R"(no "images" field)"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":"a"})"), R"("images" must be an array)"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":[]})"), R"("images" is empty)"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":[1]})"),
                 R"("images" must be an array of strings)"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["Bad/UPPER:1"]})"), "is not a valid reference"));
  CHECK(
      Contains(a.Error(post, jobs, R"({"images":["a:1"],"platform":"linux"})"), "is not os/arch"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"percent":0})"),
                 R"("percent" must be 1..100)"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"percent":101})"),
                 R"("percent" is 101, more than 100)"));
  CHECK(
      Contains(a.Error(post, jobs, R"({"images":["a:1"],"percent":-1})"), "non-negative integer"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"parallel":0})"),
                 R"("parallel" must be 1..32)"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"ttl_s":"1h"})"),
                 R"("ttl_s" must be a non-negative integer)"));
  CHECK(
      Contains(a.Error(post, jobs, R"({"images":["a:1"],"selector":"zone"})"), "is not KEY=VALUE"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"selector":{"zone":1}})"),
                 "must be a string"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"selector":5})"),
                 "must be an object of strings"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"nodes":[""]})"), "non-empty string"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"snapshots":"yes"})"),
                 R"("snapshots" must be true or false)"));
  CHECK(Contains(a.Error(post, jobs, R"({"images":["a:1"],"selecter":{}})"),
                 R"(unknown field "selecter")"));
  // Nobody polled yet: a valid job selects no one.
  CHECK(
      Contains(a.Error(post, jobs, R"({"images":["a:1"]})", 409), "matches none of the 0 agents"));
}

TEST_CASE("prefetch api: malformed polls, reports and paths") {
  Api a;
  const auto post = http::verb::post;
  CHECK(Contains(a.Error(post, "/v1/prefetch/poll", R"({"node":"n1"})"), R"(no "agent" field)"));
  CHECK(Contains(a.Error(post, "/v1/prefetch/poll", R"({"agent":"a","node":""})"),
                 R"("node" must be a non-empty)"));
  CHECK(Contains(a.Error(post, "/v1/prefetch/poll", R"({"agent":"a","node":"n","labels":"x"})"),
                 "is not KEY=VALUE"));
  auto [status, j] =
      a.Call(post, "/v1/prefetch/poll", "wait_ms=soon", R"({"agent":"a","node":"n"})");
  CHECK(status == 400);
  CHECK(Contains(j.value("error", ""), "wait_ms \"soon\" is not a non-negative integer"));
  for (const char* bad : {"swarm_port=0", "swarm_port=65536", "swarm_port=x", "swarm_port="}) {
    auto reply = a.Call(post, "/v1/prefetch/poll", bad, R"({"agent":"a","node":"n"})");
    CHECK_MESSAGE(reply.first == 400, bad);
    CHECK_MESSAGE(Contains(reply.second.value("error", ""), "is not a port (1 to 65535)"), bad);
  }
  // A poll's swarm endpoint is its TCP source address with the port it reported.
  BlobRequest poll{post, "/v1/prefetch/poll", "wait_ms=0&swarm_port=6881",
                   R"({"agent":"a","node":"n"})", boost::asio::ip::make_address("10.1.2.3")};
  REQUIRE(a.api.HandleNow(poll, kT0).status == 200);
  REQUIRE(a.api.jobs().Agents().at("n").peer.has_value());
  CHECK(a.api.jobs().Agents().at("n").peer->ToString() == "10.1.2.3:6881");
  // Without swarm_port (an older agent) the node has no endpoint.
  a.Poll("n");
  CHECK_FALSE(a.api.jobs().Agents().at("n").peer.has_value());
  CHECK(Contains(a.Error(http::verb::get, "/v1/prefetch/poll", "", 405), "use POST"));
  CHECK(Contains(a.Error(http::verb::delete_, "/v1/prefetch/jobs", "", 405), "use GET, POST"));
  CHECK(Contains(a.Error(http::verb::get, "/v1/prefetch/nothing", "", 404),
                 "no such prefetch endpoint"));
  CHECK(Contains(a.Error(http::verb::get, "/v1/prefetch/jobs/pj-x", "", 404), "no prefetch job"));

  const auto put = http::verb::put;
  const std::string_view report = "/v1/prefetch/jobs/pj-x/nodes/n1";
  CHECK(Contains(a.Error(put, report, R"({"state":"done"})"), R"(no "agent" field)"));
  CHECK(Contains(a.Error(put, report, R"({"agent":"a","state":"busy"})"),
                 "is not running, done or failed"));
  CHECK(Contains(a.Error(put, report, R"({"agent":"a","state":"failed"})"), R"(needs an "error")"));
  CHECK(Contains(
      a.Error(put, report, R"({"agent":"a","state":"running","bytes_done":5,"bytes_total":4})"),
      "must not exceed"));
  CHECK(
      Contains(a.Error(put, report, R"({"agent":"a","state":"running"})", 404), "no prefetch job"));
  CHECK(Contains(a.Error(put, "/v1/prefetch/jobs/pj-x/nodes/", "{}", 404),
                 "no such prefetch endpoint"));
}

TEST_CASE("prefetch api: a job is created on polling agents, handed out and reported on") {
  Api a;
  a.Poll("n1", R"({"zone":"a"})");
  a.Poll("n2", R"("zone=b,gpu=yes")");
  auto [agents_status, agents] = a.Call(http::verb::get, "/v1/prefetch/agents", "", "");
  CHECK(agents_status == 200);
  CHECK(agents["agents"].size() == 2);
  CHECK(agents["agents"][1]["labels"]["gpu"] == "yes");

  auto created = a.Call(http::verb::post, "/v1/prefetch/jobs", "",
                        R"({"images":["gcr.io/p/a:1"],"selector":"zone=b","ttl_s":60,)"
                        R"("snapshots":true})");
  const json& job = created.second;
  REQUIRE_MESSAGE(created.first == 201, job.dump());
  const std::string id = job["id"];
  REQUIRE(job["nodes"].size() == 1);
  CHECK(job["nodes"][0]["node"] == "n2");
  CHECK(job["nodes"][0]["state"] == "pending");
  CHECK(job["state"] == "running");

  auto [poll_status, poll] =
      a.Call(http::verb::post, "/v1/prefetch/poll", "", R"({"agent":"n2-a","node":"n2"})");
  CHECK(poll_status == 200);
  REQUIRE(poll["jobs"].size() == 1);
  CHECK(poll["jobs"][0]["id"] == id);
  CHECK(poll["jobs"][0]["ttl_s"] == 60);
  CHECK(poll["jobs"][0]["snapshots"] == true);  // the agent extracts the layers too

  const std::string path = "/v1/prefetch/jobs/" + id + "/nodes/n2";
  auto [r1, b1] = a.Call(http::verb::put, path, "",
                         R"({"agent":"n2-a","state":"running","bytes_done":5,"bytes_total":10})");
  CHECK(r1 == 200);
  CHECK(b1["job_state"] == "running");
  auto [r2, b2] = a.Call(http::verb::put, path, "", R"({"agent":"other","state":"done"})");
  CHECK(r2 == 409);
  auto [r3, b3] = a.Call(http::verb::put, path, "",
                         R"({"agent":"n2-a","state":"done","bytes_done":10,"bytes_total":10})");
  CHECK(r3 == 200);
  CHECK(b3["job_state"] == "done");
  auto [g, got] = a.Call(http::verb::get, "/v1/prefetch/jobs/" + id, "", "");
  CHECK(g == 200);
  CHECK(got["state"] == "done");
  CHECK(got["totals"]["done"] == 1);
  CHECK(got["nodes"][0]["bytes_done"] == 10);
  auto [l, list] = a.Call(http::verb::get, "/v1/prefetch/jobs", "", "");
  CHECK(l == 200);
  CHECK(list["jobs"].size() == 1);
  CHECK_FALSE(list["jobs"][0].contains("nodes"));
}

}  // namespace shoal::tracker
