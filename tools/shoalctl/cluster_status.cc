#include "tools/shoalctl/cluster_status.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "tools/shoalctl/human.h"

namespace shoal::ctl {
namespace {

using json = nlohmann::json;

// A non-negative integer field, 0 when absent or not a number (replicas may be older or newer).
uint64_t U(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer()) return static_cast<uint64_t>(std::max<int64_t>(0, it->get<int64_t>()));
  if (it->is_number_float()) return it->get<double>() > 0 ? static_cast<uint64_t>(it->get<double>()) : 0;
  return 0;
}
std::string S(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}
const json& Arr(const json& j, const char* key) {
  static const json kEmpty = json::array();
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : kEmpty;
}
const json& Obj(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

std::string Pad(std::string s, size_t width) {
  if (s.size() > width) return s.substr(0, width - 1) + "~";
  return s + std::string(width - s.size(), ' ');
}
std::string PadLeft(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

}  // namespace

json MergeClusterViews(const std::vector<ReplicaView>& replicas) {
  json out = {{"replicas", json::array()}};
  uint64_t leases = 0, cap_sum = 0, cap_cluster = 0, bytes = 0, waiters = 0, up = 0;
  std::map<std::string, json> blobs;  // by digest: the most advanced entry
  json jobs = json::array();
  std::map<std::string, json> stale;  // by node
  for (const ReplicaView& r : replicas) {
    json row = {{"url", r.url}, {"up", r.view.has_value()}};
    if (!r.view) {
      row["error"] = r.error;
      out["replicas"].push_back(row);
      continue;
    }
    ++up;
    const json& v = *r.view;
    const json& u = Obj(v, "upstream");
    const json& a = Obj(v, "agents");
    row["tracker_id"] = S(v, "tracker_id");
    row["agents_live"] = U(a, "live");
    row["agents_stale"] = U(a, "stale");
    row["leases_active"] = U(u, "leases_active");
    row["cap_this_replica"] = U(u, "cap_this_replica");
    row["blobs"] = U(Obj(v, "blobs"), "count");
    row["upstream_bytes"] = U(u, "bytes_total");
    out["replicas"].push_back(row);
    leases += U(u, "leases_active");
    cap_sum += U(u, "cap_this_replica");
    cap_cluster = std::max(cap_cluster, U(u, "cap_cluster"));
    bytes += U(u, "bytes_total");
    waiters += U(u, "lease_waiters");
    for (const json& b : Arr(Obj(v, "blobs"), "recent")) {
      std::string d = S(b, "digest");
      auto it = blobs.find(d);
      // After a fail-over two replicas may hold a table of one blob: keep the one further on.
      if (it == blobs.end() || U(b, "chunks_ready") > U(it->second, "chunks_ready")) {
        blobs[d] = b;
      }
    }
    for (const json& j : Arr(v, "prefetch_jobs")) {
      json copy = j;
      copy["replica"] = r.url;
      jobs.push_back(std::move(copy));
    }
    for (const json& s : Arr(a, "stale_agents")) {
      std::string node = S(s, "node");
      auto it = stale.find(node);
      if (it == stale.end() || U(s, "silent_ms") < U(it->second, "silent_ms")) stale[node] = s;
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const json& a, const json& b) {
    bool ra = S(a, "state") == "running", rb = S(b, "state") == "running";
    if (ra != rb) return ra;
    return U(a, "age_ms") < U(b, "age_ms");
  });
  json blob_list = json::array();
  for (auto& [d, b] : blobs) blob_list.push_back(b);
  std::sort(blob_list.begin(), blob_list.end(), [](const json& a, const json& b) {
    std::string ka = S(a, "registry") + "/" + S(a, "repository");
    std::string kb = S(b, "registry") + "/" + S(b, "repository");
    return ka != kb ? ka < kb : U(a, "age_ms") > U(b, "age_ms");
  });
  json stale_list = json::array();
  for (auto& [n, s] : stale) stale_list.push_back(s);
  out["replicas_up"] = up;
  out["upstream"] = {{"leases_active", leases},
                     {"cap_replicas_up", cap_sum},
                     {"cap_cluster", cap_cluster},
                     {"bytes_total", bytes},
                     {"lease_waiters", waiters}};
  out["blobs"] = std::move(blob_list);
  out["prefetch_jobs"] = std::move(jobs);
  out["stale_agents"] = std::move(stale_list);
  return out;
}

ImageState ImageCompletion(const json& merged, const std::string& image,
                           const std::vector<std::string>& nodes, std::string* why) {
  const json* newest = nullptr;
  for (const json& j : Arr(merged, "prefetch_jobs")) {
    const json& images = Arr(j, "images");
    if (std::find(images.begin(), images.end(), image) == images.end()) continue;
    if (!newest || U(j, "age_ms") < U(*newest, "age_ms")) newest = &j;
  }
  auto say = [&](std::string text) {
    if (why) *why = std::move(text);
  };
  if (!newest) {
    say("no prefetch job names " + image + " (shoalctl prefetch --cluster " + image + ")");
    return ImageState::kUnknown;
  }
  const json& job = *newest;
  const json& totals = Obj(job, "totals");
  const std::string id = S(job, "id");
  if (nodes.empty()) {
    std::string state = S(job, "state");
    say("job " + id + ": " + std::to_string(U(totals, "done")) + " of " +
        std::to_string(U(totals, "nodes")) + " nodes done, " + std::to_string(U(totals, "failed")) +
        " failed");
    if (state == "done") return ImageState::kComplete;
    if (state == "failed") return ImageState::kFailed;
    return ImageState::kInProgress;
  }
  std::map<std::string, std::string> shown;  // node -> state, the job's slowest nodes
  for (const json& n : Arr(job, "slowest_nodes")) shown[S(n, "node")] = S(n, "state");
  const bool all_done = U(totals, "nodes") > 0 && U(totals, "done") == U(totals, "nodes");
  const bool all_shown = shown.size() == U(totals, "nodes");
  std::vector<std::string> failed, waiting;
  for (const std::string& node : nodes) {
    auto it = shown.find(node);
    if (it != shown.end()) {
      if (it->second == "failed") failed.push_back(node);
      if (it->second != "done" && it->second != "failed") waiting.push_back(node);
    } else if (all_shown) {
      failed.push_back(node + " (not in job " + id + ")");
    } else if (!all_done) {
      waiting.push_back(node);  // among the further-on nodes the view does not list
    }
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  if (!failed.empty()) {
    say("job " + id + ": failed on " + list(failed));
    return ImageState::kFailed;
  }
  if (!waiting.empty()) {
    say("job " + id + ": not yet done on " + list(waiting));
    return ImageState::kInProgress;
  }
  say("job " + id + ": done on " + list(nodes));
  return ImageState::kComplete;
}

std::string RenderClusterStatus(const json& merged) {
  std::string out;
  char line[512];
  const json& reps = Arr(merged, "replicas");
  std::snprintf(line, sizeof(line), "tracker replicas: %llu of %zu answer\n",
                static_cast<unsigned long long>(U(merged, "replicas_up")), reps.size());
  out += line;
  out += "  " + Pad("replica", 34) + Pad("id", 18) + PadLeft("agents", 7) + PadLeft("silent", 7) +
         PadLeft("leases", 9) + PadLeft("blobs", 7) + PadLeft("upstream", 12) + "\n";
  for (const json& r : reps) {
    if (!r.value("up", false)) {
      out += "  " + Pad(S(r, "url"), 34) + "unreachable: " + S(r, "error") + "\n";
      continue;
    }
    out += "  " + Pad(S(r, "url"), 34) + Pad(S(r, "tracker_id"), 18) +
           PadLeft(std::to_string(U(r, "agents_live")), 7) +
           PadLeft(std::to_string(U(r, "agents_stale")), 7) +
           PadLeft(std::to_string(U(r, "leases_active")) + "/" +
                       std::to_string(U(r, "cap_this_replica")),
                   9) +
           PadLeft(std::to_string(U(r, "blobs")), 7) +
           PadLeft(Human(static_cast<double>(U(r, "upstream_bytes"))), 12) + "\n";
  }
  const json& u = Obj(merged, "upstream");
  std::snprintf(line, sizeof(line),
                "upstream: %llu fetches in flight (cap %llu over the replicas that answer, %llu "
                "for the cluster), %s fetched, %llu requests waiting\n",
                static_cast<unsigned long long>(U(u, "leases_active")),
                static_cast<unsigned long long>(U(u, "cap_replicas_up")),
                static_cast<unsigned long long>(U(u, "cap_cluster")),
                Human(static_cast<double>(U(u, "bytes_total"))).c_str(),
                static_cast<unsigned long long>(U(u, "lease_waiters")));
  out += line;

  const json& blobs = Arr(merged, "blobs");
  out += "\nblobs (" + std::to_string(blobs.size()) + ")\n";
  if (!blobs.empty()) {
    out += "  " + Pad("repository", 30) + Pad("blob", 14) + PadLeft("size", 11) +
           PadLeft("chunks", 10) + PadLeft("nodes", 7) + PadLeft("pulling", 8) +
           PadLeft("upstream", 10) + PadLeft("ready in", 10) + "\n";
  }
  for (const json& b : blobs) {
    std::string repo = S(b, "registry").empty() ? S(b, "repository")
                                                : S(b, "registry") + "/" + S(b, "repository");
    std::string digest = S(b, "digest");
    double size = static_cast<double>(U(b, "size"));
    char over[32];
    std::snprintf(over, sizeof(over), "%.2fx", size > 0 ? U(b, "upstream_bytes") / size : 0.0);
    auto ready = b.find("ready_after_ms");
    std::string ready_in = ready != b.end() && ready->is_number()
                               ? HumanDuration(ready->get<double>() / 1000)
                               : "-";
    out += "  " + Pad(repo, 30) + Pad(digest.size() > 19 ? digest.substr(7, 12) : digest, 14) +
           PadLeft(Human(size), 11) +
           PadLeft(std::to_string(U(b, "chunks_ready")) + "/" + std::to_string(U(b, "chunks")),
                   10) +
           PadLeft(std::to_string(U(b, "nodes_done")), 7) +
           PadLeft(std::to_string(U(b, "nodes_downloading")), 8) + PadLeft(over, 10) +
           PadLeft(ready_in, 10) + "\n";
  }

  const json& jobs = Arr(merged, "prefetch_jobs");
  out += "\nprefetch jobs (" + std::to_string(jobs.size()) + ")\n";
  for (const json& j : jobs) {
    const json& t = Obj(j, "totals");
    std::string images;
    for (const json& i : Arr(j, "images")) images += (images.empty() ? "" : ", ") + i.get<std::string>();
    std::snprintf(line, sizeof(line),
                  "  %s %-8s %llu/%llu nodes done, %llu failed, %s of %s, %s  %s\n",
                  S(j, "id").c_str(), S(j, "state").c_str(),
                  static_cast<unsigned long long>(U(t, "done")),
                  static_cast<unsigned long long>(U(t, "nodes")),
                  static_cast<unsigned long long>(U(t, "failed")),
                  Human(static_cast<double>(U(t, "bytes_done"))).c_str(),
                  Human(static_cast<double>(U(t, "bytes_total"))).c_str(),
                  HumanDuration(U(j, "elapsed_ms") / 1000.0).c_str(), images.c_str());
    out += line;
    int shown = 0;
    for (const json& n : Arr(j, "slowest_nodes")) {
      if (S(n, "state") == "done" || shown == 5) continue;
      ++shown;
      std::snprintf(line, sizeof(line), "      slow: %-24s %-8s %s of %s %s\n",
                    S(n, "node").c_str(), S(n, "state").c_str(),
                    Human(static_cast<double>(U(n, "bytes_done"))).c_str(),
                    Human(static_cast<double>(U(n, "bytes_total"))).c_str(),
                    S(n, "error").c_str());
      out += line;
    }
  }
  const json& stale = Arr(merged, "stale_agents");
  if (!stale.empty()) {
    out += "\nagents that stopped polling (" + std::to_string(stale.size()) + ")\n";
    for (const json& s : stale) {
      out += "  " + Pad(S(s, "node"), 30) + " silent " + HumanDuration(U(s, "silent_ms") / 1000.0) +
             "\n";
    }
  }
  return out;
}

}  // namespace shoal::ctl
