#pragma once
// `shoalctl status --cluster`: every tracker replica's GET /v1/cluster (docs/api.md) merged into
// one view of the cluster, whether an image is complete on the chosen nodes, and the view as a
// terminal table. Pure: the caller fetches the replicas' answers.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shoal::ctl {

// One replica's answer, or why there is none.
struct ReplicaView {
  std::string url;
  std::optional<nlohmann::json> view;  // the /v1/cluster document
  std::string error;                   // when view is empty
};

// The merged view (the "--json" output): "replicas" (per replica: url, tracker_id, up, error,
// agents live/stale, leases, cap, blobs), "upstream" (leases, caps and bytes summed over the
// replicas that answered), "images" (one entry per manifest digest, most recent first; blobs its
// replica has no table of are filled from the other replicas' answers and the figures recomputed),
// "blobs" (every replica's recent blobs, one entry per digest: the most advanced),
// "prefetch_jobs" (concatenated, running first), "stale_agents" (deduplicated by node).
nlohmann::json MergeClusterViews(const std::vector<ReplicaView>& replicas);

// Whether `image` is complete on `nodes` (empty: on every node of the newest job naming it). When
// a prefetch job names the image, the newest one decides: kComplete when it has every chosen node
// done; kFailed when one failed or a chosen node is in no such job; kInProgress otherwise.
// Without a job, the image's entry ("images") decides: for `nodes` empty, kComplete when it is
// complete (every node that started the image holds all its blobs), else kInProgress; with
// `nodes`, kFailed when one is stalled among the entry's slowest nodes, kInProgress when one is
// listed there otherwise, and kUnknown when none is listed (done, or never started); with no
// entry either, kUnknown. `why` says which nodes are missing, stalled or failed, and the entry's
// figures.
enum class ImageState { kComplete, kInProgress, kFailed, kUnknown };
ImageState ImageCompletion(const nlohmann::json& merged, const std::string& image,
                           const std::vector<std::string>& nodes, std::string* why);

// The merged view as text for a terminal (lines end in '\n').
std::string RenderClusterStatus(const nlohmann::json& merged);

}  // namespace shoal::ctl
