#include "tools/shoalctl/cluster_status.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "lib/oci/reference.h"
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

// Fills the blobs of image that its replica has no table of from the other replicas' entries
// (`known`: by digest, the most advanced), and recomputes the image's figures from its blob list
// when the list covers every blob, as the tracker does (docs/api.md, "images").
void CompleteImage(json& image, const std::map<std::string, json>& known) {
  json& blobs = image["blobs"];
  bool filled = false;
  for (json& b : blobs) {
    if (b.value("known", false)) continue;
    auto it = known.find(S(b, "digest"));
    if (it == known.end()) continue;
    for (const char* key : {"chunks", "chunks_ready", "upstream_bytes", "peer_bytes", "held_bytes",
                            "nodes_done", "nodes_seen", "age_ms", "ready_after_ms"}) {
      if (it->second.contains(key)) b[key] = it->second[key];
    }
    b["known"] = true;
    filled = true;
  }
  if (!filled || blobs.size() != U(image, "blobs_total")) return;
  uint64_t upstream = 0, peers = 0, held = 0, known_n = 0, ready = 0, seen = 0;
  uint64_t done = UINT64_MAX;
  for (const json& b : blobs) {
    if (!b.value("known", false)) {
      done = 0;
      continue;
    }
    ++known_n;
    if (U(b, "chunks") > 0 && U(b, "chunks_ready") == U(b, "chunks")) ++ready;
    upstream += U(b, "upstream_bytes");
    peers += U(b, "peer_bytes");
    held += U(b, "held_bytes");
    done = std::min(done, U(b, "nodes_done"));
    seen = std::max(seen, U(b, "nodes_seen"));
  }
  const bool all_ready = !blobs.empty() && ready == blobs.size();
  const uint64_t nodes_done = all_ready ? done : 0;
  const uint64_t in_progress = seen > nodes_done ? seen - nodes_done : 0;
  const bool complete = all_ready && nodes_done > 0 && in_progress == 0;
  image["blobs_known"] = known_n;
  image["blobs_ready"] = ready;
  image["upstream_bytes"] = upstream;
  image["peer_bytes"] = peers;
  image["held_bytes"] = held;
  image["nodes_done"] = nodes_done;
  image["nodes_in_progress"] = in_progress;
  image["complete"] = complete;
  // The rate is the one the image's replica measured over its own blobs.
  const uint64_t target = seen * U(image, "size");
  const uint64_t remaining = target > held ? target - held : 0;
  const double rate = static_cast<double>(U(image, "rate_bytes_per_s"));
  if (complete || (seen > 0 && remaining == 0)) {
    image["eta_ms"] = 0;
  } else if (rate > 0 && seen > 0) {
    image["eta_ms"] = static_cast<uint64_t>(static_cast<double>(remaining) * 1000.0 / rate);
  } else {
    image["eta_ms"] = nullptr;
  }
}

// The share of its bytes a slowest-node entry holds.
double ShareDone(const json& n) {
  const uint64_t total = U(n, "bytes_total");
  return total ? static_cast<double>(U(n, "bytes_done")) / static_cast<double>(total) : 0.0;
}

// Without a prefetch job, each replica reads the nodes' parts of the blobs it owns: the image's
// slowest nodes are every replica's, each node once where it is furthest behind (stalled first),
// and its stalled count the most any replica saw.
void MergeSlowestNodes(json& image, const std::vector<json>& entries) {
  if (!image["prefetch_job"].is_null() || entries.size() < 2) return;
  std::map<std::string, json> worst;  // by node
  uint64_t failed = 0;
  for (const json& e : entries) {
    failed = std::max(failed, U(e, "nodes_failed"));
    for (const json& n : Arr(e, "slowest_nodes")) {
      auto it = worst.find(S(n, "node"));
      const bool stalled = S(n, "state") == "stalled";
      if (it == worst.end() || (stalled && S(it->second, "state") != "stalled") ||
          (stalled == (S(it->second, "state") == "stalled") &&
           ShareDone(n) < ShareDone(it->second))) {
        worst[S(n, "node")] = n;
      }
    }
  }
  json list = json::array();
  for (auto& entry : worst) list.push_back(std::move(entry.second));
  std::stable_sort(list.begin(), list.end(), [](const json& a, const json& b) {
    const bool sa = S(a, "state") == "stalled", sb = S(b, "state") == "stalled";
    return sa != sb ? sa : ShareDone(a) < ShareDone(b);
  });
  if (list.size() > 10) list.erase(list.begin() + 10, list.end());
  image["slowest_nodes"] = std::move(list);
  image["nodes_failed"] = failed;
}

std::string Refs(const json& image) {
  std::string s;
  for (const json& r : Arr(image, "references")) {
    if (r.is_string()) s += (s.empty() ? "" : ", ") + r.get<std::string>();
  }
  return s.empty() ? S(image, "manifest") : s;
}

}  // namespace

json MergeClusterViews(const std::vector<ReplicaView>& replicas) {
  json out = {{"replicas", json::array()}};
  uint64_t leases = 0, cap_sum = 0, cap_cluster = 0, bytes = 0, waiters = 0, up = 0;
  std::map<std::string, json> blobs;  // by digest: the most advanced entry
  std::map<std::string, json> image_blobs;  // every replica's known image blobs, by digest
  std::map<std::string, json> images;       // by manifest digest: the entry knowing most blobs
  std::map<std::string, std::vector<json>> image_entries;  // by manifest digest: every replica's
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
    for (const json& im : Arr(v, "images")) {
      std::string d = S(im, "manifest");
      auto it = images.find(d);
      if (it == images.end() || U(im, "blobs_known") > U(it->second, "blobs_known")) images[d] = im;
      image_entries[d].push_back(im);
      for (const json& b : Arr(im, "blobs")) {
        if (!b.value("known", false)) continue;
        auto known = image_blobs.find(S(b, "digest"));
        if (known == image_blobs.end() || U(b, "chunks_ready") > U(known->second, "chunks_ready")) {
          image_blobs[S(b, "digest")] = b;
        }
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
  // An image's blobs may be owned by other replicas: fill them from the blob lists.
  for (auto& [d, b] : blobs) {
    auto it = image_blobs.find(d);
    if (it == image_blobs.end() || U(b, "chunks_ready") > U(it->second, "chunks_ready")) {
      image_blobs[d] = b;
    }
  }
  json image_list = json::array();
  for (auto& [d, im] : images) {
    CompleteImage(im, image_blobs);
    MergeSlowestNodes(im, image_entries[d]);
    image_list.push_back(im);
  }
  std::sort(image_list.begin(), image_list.end(), [](const json& a, const json& b) {
    return U(a, "age_ms") != U(b, "age_ms") ? U(a, "age_ms") < U(b, "age_ms")
                                            : S(a, "manifest") < S(b, "manifest");
  });
  out["replicas_up"] = up;
  out["upstream"] = {{"leases_active", leases},
                     {"cap_replicas_up", cap_sum},
                     {"cap_cluster", cap_cluster},
                     {"bytes_total", bytes},
                     {"lease_waiters", waiters}};
  out["images"] = std::move(image_list);
  out["blobs"] = std::move(blob_list);
  out["prefetch_jobs"] = std::move(jobs);
  out["stale_agents"] = std::move(stale_list);
  return out;
}

namespace {

// The merged view's entry of image (a reference, normalised as the tracker keys them, or a
// manifest digest), or nullptr.
const json* FindImage(const json& merged, const std::string& image) {
  std::string key = image;
  if (auto ref = oci::ParseImageRef(image)) key = ref.value().str();
  for (const json& im : Arr(merged, "images")) {
    for (const json& r : Arr(im, "references")) {
      if (r.is_string() && (r.get<std::string>() == key || r.get<std::string>() == image)) {
        return &im;
      }
    }
    if (S(im, "manifest") == image) return &im;
  }
  return nullptr;
}

// One line of an image's figures.
std::string ImageFigures(const json& im) {
  char line[512];
  const double size = static_cast<double>(U(im, "size"));
  auto eta = im.find("eta_ms");
  std::string left = im.value("complete", false) ? "complete"
                     : eta != im.end() && eta->is_number()
                         ? "about " + HumanDuration(eta->get<double>() / 1000) + " left"
                         : "time left unknown";
  std::snprintf(line, sizeof(line),
                "%llu nodes done, %llu in progress, %llu failed; %s of %s from upstream (%.2fx), "
                "%s from peers; %s since the start, %s",
                static_cast<unsigned long long>(U(im, "nodes_done")),
                static_cast<unsigned long long>(U(im, "nodes_in_progress")),
                static_cast<unsigned long long>(U(im, "nodes_failed")),
                Human(static_cast<double>(U(im, "upstream_bytes"))).c_str(), Human(size).c_str(),
                size > 0 ? U(im, "upstream_bytes") / size : 0.0,
                Human(static_cast<double>(U(im, "peer_bytes"))).c_str(),
                HumanDuration(U(im, "age_ms") / 1000.0).c_str(), left.c_str());
  std::string out = line;
  if (U(im, "blobs_known") < U(im, "blobs_total")) {
    out += " (" + std::to_string(U(im, "blobs_total") - U(im, "blobs_known")) +
           " blobs on replicas that did not answer)";
  }
  return out;
}

}  // namespace

ImageState ImageCompletion(const json& merged, const std::string& image,
                           const std::vector<std::string>& nodes, std::string* why) {
  const json* newest = nullptr;
  for (const json& j : Arr(merged, "prefetch_jobs")) {
    const json& images = Arr(j, "images");
    if (std::find(images.begin(), images.end(), image) == images.end()) continue;
    if (!newest || U(j, "age_ms") < U(*newest, "age_ms")) newest = &j;
  }
  // The image's entry (docs/api.md, "images"): how far the pull of it is on every node that
  // started one, prefetch or not.
  const json* entry = FindImage(merged, image);
  std::string figures = entry ? ImageFigures(*entry) : "";
  auto say = [&](std::string text) {
    if (!figures.empty()) text += (text.empty() ? "" : "; ") + figures;
    if (why) *why = std::move(text);
  };
  if (!newest && entry) {
    // No job names it: the swarms tell, and name the nodes among its slowest that poll with
    // their swarm's port (docs/api.md, "images").
    if (!nodes.empty()) {
      std::map<std::string, const json*> slow;
      for (const json& n : Arr(*entry, "slowest_nodes")) slow[S(n, "node")] = &n;
      std::vector<std::string> stalled, running, untold;
      for (const std::string& node : nodes) {
        auto it = slow.find(node);
        if (it == slow.end()) {
          untold.push_back(node);
        } else if (S(*it->second, "state") == "stalled") {
          stalled.push_back(node + " (" + S(*it->second, "error") + ")");
        } else {
          running.push_back(node);
        }
      }
      auto list = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
        return s;
      };
      if (!stalled.empty()) {
        say("stalled on " + list(stalled));
        return ImageState::kFailed;
      }
      if (!running.empty()) {
        say("not yet done on " + list(running));
        return ImageState::kInProgress;
      }
      say("no prefetch job names " + image + " and " + list(untold) +
          " are not among its slowest nodes: done, or not started (the swarms cannot tell which)");
      return ImageState::kUnknown;
    }
    say("");
    if (U(*entry, "blobs_known") < U(*entry, "blobs_total")) return ImageState::kInProgress;
    return entry->value("complete", false) ? ImageState::kComplete : ImageState::kInProgress;
  }
  if (!newest) {
    say("no prefetch job names " + image + " and no replica has resolved it (shoalctl prefetch "
        "--cluster " + image + ")");
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

  const json& images = Arr(merged, "images");
  out += "\nimages (" + std::to_string(images.size()) + ")\n";
  for (const json& im : images) {
    std::string platform = S(im, "platform");
    out += "  " + Refs(im) + (platform.empty() ? "" : " (" + platform + ")") + "  " +
           S(im, "manifest").substr(0, 19) + "\n      " + ImageFigures(im) + "\n";
    int shown = 0;
    for (const json& n : Arr(im, "slowest_nodes")) {
      if (shown++ == 5) break;
      std::snprintf(line, sizeof(line), "      slow: %-24s %-8s %s of %s %s\n",
                    S(n, "node").c_str(), S(n, "state").c_str(),
                    Human(static_cast<double>(U(n, "bytes_done"))).c_str(),
                    Human(static_cast<double>(U(n, "bytes_total"))).c_str(),
                    S(n, "error").c_str());
      out += line;
    }
  }

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
