// `shoalctl prefetch IMAGE...`: warms caches before they are needed. --node (the default) asks
// this node's agent (admin API /shoal/v1/prefetch); --cluster asks the tracker
// (/v1/prefetch/jobs), whose agents each run the same node prefetch. Shows live progress, then
// a result table (or --json); the exit code is 1 if any node failed or timed out.
#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>
#include <variant>

#include <nlohmann/json.hpp>

#include "lib/auth/tokens.h"
#include "lib/http/url.h"
#include "lib/oci/reference.h"
#include "tools/shoalctl/commands.h"
#include "tools/shoalctl/human.h"
#include "tools/shoalctl/json_call.h"
#include "tools/shoalctl/progress_view.h"

namespace shoal::ctl {
namespace {

namespace bhttp = boost::beast::http;
using nlohmann::json;

struct PrefetchFlags {
  std::vector<std::string> images;
  bool node = false;
  bool cluster = false;
  std::string agent = "http://127.0.0.1:5000";
  std::vector<std::string> trackers;
  std::string operator_token_file;  // --cluster: the operator token for the tracker
  std::string operator_token;       // read from it
  std::vector<std::string> nodes;
  std::vector<std::string> selector;  // k=v, all must match
  int percent = -1;
  std::string ttl = "24h";
  std::string platform = "linux/amd64";
  std::string timeout = "0";
  int parallel = 4;
  bool snapshots = false;
  bool json = false;
};

// Where a job lives and how to read it back.
struct JobHandle {
  std::string base_url;  // the agent or the tracker replica that took the job
  std::string path;      // GET path of the job
  std::string flag;      // the flag that named base_url, for errors
  std::string id;
  std::string bearer;  // the operator token, for a tracker
};

// The rows of a node job: one per blob.
std::vector<ProgressRow> NodeRows(const json& job) {
  std::vector<ProgressRow> rows;
  for (const auto& b : job.value("blobs", json::array())) {
    ProgressRow r;
    std::string digest = b.value("digest", "");
    r.name = b.value("kind", "blob") + " " + digest.substr(digest.find(':') + 1, 12);
    r.state = b.value("state", "");
    r.done = b.value("done", uint64_t{0});
    r.total = b.value("size", uint64_t{0});
    r.error = b.value("error", "");
    rows.push_back(std::move(r));
  }
  // With --snapshots, one row per image for its layers extracted for containerd.
  for (const auto& i : job.value("images", json::array())) {
    if (!i.contains("snapshots")) continue;
    const json& s = i["snapshots"];
    ProgressRow r;
    r.name = "layers for containerd " + i.value("ref", "");
    const bool done = s.value("done", false);
    const uint64_t failed = s.value("failed", uint64_t{0});
    r.state = !done ? "extracting" : failed > 0 || s.contains("error") ? "failed" : "done";
    r.done = s.value("prepared", uint64_t{0});
    r.total = s.value("layers", uint64_t{0});
    r.unit = "layers";
    r.error = s.value("error", "");
    rows.push_back(std::move(r));
  }
  return rows;
}

// A node job as one result row (the node's outcome).
ProgressRow NodeResult(const json& job, const std::string& name) {
  ProgressRow r;
  r.name = name;
  std::string state = job.value("state", "");
  r.state = state == "running" ? "running" : state;
  r.done = job.value("bytes_done", uint64_t{0});
  r.total = job.value("bytes_total", uint64_t{0});
  r.seconds = job.value("elapsed_ms", 0.0) / 1000;
  r.error = job.value("error", "");
  return r;
}

// The rows of a cluster job: one per node.
std::vector<ProgressRow> ClusterRows(const json& job) {
  std::vector<ProgressRow> rows;
  for (const auto& n : job.value("nodes", json::array())) {
    ProgressRow r;
    r.name = n.value("node", "");
    r.state = n.value("state", "");
    r.done = n.value("bytes_done", uint64_t{0});
    r.total = n.value("bytes_total", uint64_t{0});
    r.seconds = n.value("elapsed_ms", 0.0) / 1000;
    r.error = n.value("error", "");
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string Title(const json& job, bool cluster) {
  char buf[256];
  if (cluster) {
    size_t ended = 0, total = 0;
    for (const auto& n : job.value("nodes", json::array())) {
      ++total;
      std::string s = n.value("state", "");
      ended += s == "done" || s == "failed";
    }
    std::snprintf(buf, sizeof(buf), "prefetch %s: %zu/%zu nodes ended", job.value("id", "").c_str(),
                  ended, total);
  } else {
    std::snprintf(buf, sizeof(buf), "prefetch %s: %zu/%zu blobs done", job.value("id", "").c_str(),
                  job.value("blobs_done", size_t{0}), job.value("blobs_total", size_t{0}));
  }
  return buf;
}

// Posts the job; returns where it lives, or the exit code after printing why it failed.
std::variant<JobHandle, int> Submit(const PrefetchFlags& f, long long ttl_s, long long timeout_s) {
  if (!f.cluster) {
    std::string target = "/shoal/v1/prefetch?platform=" + http::QueryEscape(f.platform) +
                         "&ttl=" + std::to_string(ttl_s) +
                         "&parallel=" + std::to_string(f.parallel) +
                         (f.snapshots ? "&snapshots=1" : "");
    for (const auto& i : f.images) target += "&ref=" + http::QueryEscape(i);
    auto r = JsonCall(f.agent, bhttp::verb::post, target, "", "--agent");
    if (!r) {
      std::cerr << "shoalctl prefetch: agent " << f.agent << ": " << r.error().ToString() << "\n";
      return 1;
    }
    if (r.value().status != 202 && r.value().status != 200) {
      std::cerr << "shoalctl prefetch: agent " << f.agent << " refused the job (HTTP "
                << r.value().status << "): " << r.value().Error() << "\n";
      return 1;
    }
    std::string id = r.value().body.value("id", "");
    return JobHandle{f.agent, "/shoal/v1/prefetch/" + id, "--agent", id};
  }
  json body = {
      {"images", f.images}, {"platform", f.platform}, {"ttl_s", ttl_s}, {"parallel", f.parallel}};
  if (f.snapshots) body["snapshots"] = true;
  if (timeout_s > 0) body["timeout_s"] = timeout_s;
  if (!f.nodes.empty()) body["nodes"] = f.nodes;
  if (!f.selector.empty()) {
    json sel = json::object();
    for (const auto& kv : f.selector) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "shoalctl prefetch: --selector \"" << kv << "\" is not KEY=VALUE\n";
        return 2;
      }
      sel[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    body["selector"] = sel;
  }
  if (f.percent >= 0) body["percent"] = f.percent;
  // The job lives on the first replica that takes it; every agent polls every replica.
  std::string errors;
  for (const auto& tracker : f.trackers) {
    auto r = JsonCall(tracker, bhttp::verb::post, "/v1/prefetch/jobs", body.dump(), "--tracker",
                      f.operator_token);
    if (!r) {
      errors += "\n  " + tracker + ": " + r.error().ToString();
      continue;
    }
    if (r.value().status >= 500) {
      errors +=
          "\n  " + tracker + ": HTTP " + std::to_string(r.value().status) + " " + r.value().Error();
      continue;
    }
    if (r.value().status != 201 && r.value().status != 200) {
      std::cerr << "shoalctl prefetch: tracker " << tracker << " refused the job (HTTP "
                << r.value().status << "): " << r.value().Error() << "\n";
      return 1;
    }
    std::string id = r.value().body.value("id", "");
    return JobHandle{tracker, "/v1/prefetch/jobs/" + id, "--tracker", id, f.operator_token};
  }
  std::cerr << "shoalctl prefetch: no tracker took the job:" << errors << "\n";
  return 1;
}

int RunPrefetch(PrefetchFlags f) {
  // A node selection implies --cluster (--tracker alone does not: SHOAL_TRACKERS may be set).
  if (!f.nodes.empty() || !f.selector.empty() || f.percent >= 0) {
    if (f.node) {
      std::cerr << "shoalctl prefetch: --nodes, --selector and --percent need --cluster\n";
      return 2;
    }
    f.cluster = true;
  }
  if (f.cluster && f.trackers.empty()) {
    std::cerr << "shoalctl prefetch: --cluster needs --tracker URL (or SHOAL_TRACKERS)\n";
    return 2;
  }
  if (f.cluster && !f.operator_token_file.empty()) {
    auto tokens = auth::ReadTokens(f.operator_token_file);
    if (!tokens) {
      std::cerr << "shoalctl prefetch: --operator-token-file: " << tokens.error().message << "\n";
      return 2;
    }
    f.operator_token = tokens.value().front();
  }
  auto ttl = ParseDuration(f.ttl);
  if (!ttl) {
    std::cerr << "shoalctl prefetch: --ttl \"" << f.ttl
              << "\" is not a duration (90s, 15m, 24h, 7d; 0 = until unpinned)\n";
    return 2;
  }
  auto timeout = ParseDuration(f.timeout);
  if (!timeout) {
    std::cerr << "shoalctl prefetch: --timeout \"" << f.timeout
              << "\" is not a duration (90s, 15m, 2h; 0 = none)\n";
    return 2;
  }
  for (const auto& image : f.images) {
    if (auto r = oci::ParseImageRef(image); !r) {
      std::cerr << "shoalctl prefetch: " << image << ": " << r.error().message << "\n";
      return 1;
    }
  }
  auto submitted = Submit(f, *ttl, *timeout);
  if (std::holds_alternative<int>(submitted)) return std::get<int>(submitted);
  const JobHandle handle = std::get<JobHandle>(submitted);

  const bool tty = ::isatty(STDERR_FILENO) && !f.json;
  ProgressView view(tty, stderr);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = *timeout > 0 ? start + std::chrono::seconds(*timeout)
                                     : std::chrono::steady_clock::time_point::max();
  json job;
  uint64_t version = 0;
  bool timed_out = false;
  int transport_failures = 0;
  // Long-polls return at every change; at most 4 (tty) or 1 (plain) requests a second.
  const auto min_interval = std::chrono::milliseconds(tty ? 250 : 1000);
  auto last_poll = std::chrono::steady_clock::now() - min_interval;
  for (;;) {
    std::this_thread::sleep_until(last_poll + min_interval);
    last_poll = std::chrono::steady_clock::now();
    const std::string target = handle.path + "?wait_ms=" + std::to_string(tty ? 500 : 2000) +
                               "&since=" + std::to_string(version);
    auto r = JsonCall(handle.base_url, bhttp::verb::get, target, "", handle.flag, handle.bearer);
    if (!r || r.value().status != 200) {
      // A restarted agent or tracker forgets the job; give up after a few tries.
      std::string why = !r ? r.error().ToString()
                           : "HTTP " + std::to_string(r.value().status) + " " + r.value().Error();
      if (++transport_failures >= 5 || (r && r.value().status == 404)) {
        view.Clear();
        std::cerr << "shoalctl prefetch: lost job " << handle.id << " on " << handle.base_url
                  << ": " << why << "\n";
        return 1;
      }
      continue;
    }
    transport_failures = 0;
    job = std::move(r.value().body);
    version = job.value("version", uint64_t{0});
    const bool ended = job.value("state", "running") != "running";
    // --json prints the result only (stdout and stderr are often captured together).
    if (!f.json) view.Update(Title(job, f.cluster), f.cluster ? ClusterRows(job) : NodeRows(job));
    if (ended) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      break;
    }
  }
  view.Clear();

  std::vector<ProgressRow> results =
      f.cluster ? ClusterRows(job) : std::vector<ProgressRow>{NodeResult(job, handle.base_url)};
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& r : results) {
    if (!r.Ended() && timed_out) {
      r.state = "timeout";
      r.error = "not finished after " + HumanDuration(waited) + " (--timeout " + f.timeout + ")";
    }
  }
  size_t failed = 0;
  for (const auto& r : results) failed += !r.Ok();
  if (f.json) {
    json nodes = json::array();
    for (const auto& r : results) {
      json n = {{"node", r.name},  {"ok", r.Ok()},           {"state", r.state},
                {"bytes", r.done}, {"bytes_total", r.total}, {"seconds", r.seconds}};
      if (!r.error.empty()) n["error"] = r.error;
      nodes.push_back(n);
    }
    json out = {{"mode", f.cluster ? "cluster" : "node"},
                {"job_id", handle.id},
                {"server", handle.base_url},
                {"ok", failed == 0},
                {"timed_out", timed_out},
                {"nodes", nodes},
                {"job", job}};
    std::cout << out.dump(2) << "\n";
  } else {
    if (!f.cluster) {
      for (const auto& i : job.value("images", json::array())) {
        if (i.contains("error")) {
          std::printf("%s: %s\n", i.value("ref", "").c_str(), i.value("error", "").c_str());
        }
      }
    }
    PrintResultTable("NODE", results);
    std::printf("%zu of %zu nodes ok\n", results.size() - failed, results.size());
    if (!f.cluster && job.contains("snapshots")) {
      const json& s = job["snapshots"];
      std::printf("layers extracted for containerd: %llu of %llu\n",
                  static_cast<unsigned long long>(s.value("prepared", uint64_t{0})),
                  static_cast<unsigned long long>(s.value("layers", uint64_t{0})));
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

void AddPrefetchCommand(CLI::App& app) {
  auto flags = std::make_shared<PrefetchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "prefetch",
      "Warm caches with whole images before they are needed (pinned against eviction): this "
      "node through its agent (--node, default) or many nodes through the tracker (--cluster)");
  cmd->add_option("images", flags->images, "Image references, e.g. gcr.io/proj/img:tag")
      ->required();
  auto* node = cmd->add_flag("--node", flags->node, "Prefetch on this node through its agent")
                   ->envname("SHOAL_PREFETCH_NODE");
  cmd->add_flag("--cluster", flags->cluster, "Prefetch on the tracker's agents")
      ->envname("SHOAL_PREFETCH_CLUSTER")
      ->excludes(node);
  cmd->add_option("--agent", flags->agent, "The node agent's registry shim URL (--node)")
      ->envname("SHOAL_AGENT_URL")
      ->capture_default_str();
  cmd->add_option("--tracker", flags->trackers,
                  "Tracker replica URLs (repeatable or comma-separated); the job goes to the first "
                  "that answers")
      ->envname("SHOAL_TRACKERS")
      ->delimiter(',');
  cmd->add_option("--operator-token-file", flags->operator_token_file,
                  "File holding an operator token of the trackers (--cluster); the tracker "
                  "refuses cluster jobs without one")
      ->envname("SHOAL_OPERATOR_TOKEN_FILE");
  cmd->add_option("--nodes", flags->nodes, "Only these nodes (names, comma-separated)")
      ->envname("SHOAL_PREFETCH_NODES")
      ->delimiter(',');
  cmd->add_option("--selector", flags->selector,
                  "Only nodes with these labels (KEY=VALUE, comma-separated; all must match)")
      ->envname("SHOAL_PREFETCH_SELECTOR")
      ->delimiter(',');
  cmd->add_option("--percent", flags->percent,
                  "Only this percentage of the selected nodes (a deterministic pick)")
      ->envname("SHOAL_PREFETCH_PERCENT")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--ttl", flags->ttl,
                  "Pin the images this long (90s, 15m, 24h, 7d; 0 = until unpinned)")
      ->envname("SHOAL_PREFETCH_TTL")
      ->capture_default_str();
  cmd->add_option("--platform", flags->platform, "os/arch to choose from multi-arch images")
      ->envname("SHOAL_PLATFORM")
      ->capture_default_str();
  cmd->add_option("--parallel", flags->parallel, "Blobs fetched at once on each node")
      ->envname("SHOAL_PREFETCH_PARALLEL")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  cmd->add_option("--timeout", flags->timeout,
                  "Give up waiting after this long (90s, 15m, 2h; 0 = wait until done); nodes "
                  "not done count as failed")
      ->envname("SHOAL_PREFETCH_TIMEOUT")
      ->capture_default_str();
  cmd->add_flag("--snapshots", flags->snapshots,
                "Also extract every layer for the agent's containerd snapshotter, so that a pod "
                "start extracts nothing (needs the agent's --snapshotter-socket)")
      ->envname("SHOAL_PREFETCH_SNAPSHOTS");
  cmd->add_flag("--json", flags->json, "Print the result as JSON")->envname("SHOAL_PREFETCH_JSON");
  cmd->callback([flags] { throw CLI::RuntimeError(RunPrefetch(*flags)); });
}

}  // namespace shoal::ctl
