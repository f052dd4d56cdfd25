// Fuzzes the tracker's JSON APIs (blob, manifest and prefetch) the way the server drives them:
// each request goes to the API whose Owns() takes its path, through HandleNow, which runs the
// API's pure request parser (path, method, query, JSON body) and, for a valid request, the table
// behind it. An input is a sequence of requests separated by a line "===", each
//   METHOD /v1/...?query
//   body (the rest, up to the separator)
// so one input can create a blob, lease a chunk and renew it. The clock moves one second per
// request.
//
// Properties: every answer is a 2xx, a 4xx or a 503 (never a 500, whatever the request), its body
// is a JSON object carrying the tracker_id, errors carry a non-empty "error" string, and a 405
// names the allowed methods (the server copies them into Allow). The same sequence on fresh APIs
// gives the same answers (no uninitialised state, no dependence on addresses). Sweeps and the
// status page work after any sequence.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_check.h"
#include "tracker/blobs/blob_api.h"
#include "tracker/manifests/manifest_api.h"
#include "tracker/prefetch/prefetch_api.h"

using namespace shoal;
using namespace shoal::tracker;
namespace http = boost::beast::http;

namespace {

constexpr std::string_view kTrackerId = "0123456789abcdef";
constexpr size_t kMaxRequests = 16;
const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

struct Request {
  http::verb method = http::verb::unknown;
  std::string path;
  std::string query;
  std::string body;
};

// Splits the input into at most kMaxRequests requests.
std::vector<Request> Split(std::string_view text) {
  std::vector<Request> out;
  while (!text.empty() && out.size() < kMaxRequests) {
    size_t sep = text.find("\n===\n");
    std::string_view one = text.substr(0, sep);
    text = sep == std::string_view::npos ? std::string_view() : text.substr(sep + 5);
    size_t eol = one.find('\n');
    std::string_view line = one.substr(0, eol);
    Request r;
    r.body = eol == std::string_view::npos ? std::string() : std::string(one.substr(eol + 1));
    size_t space = line.find(' ');
    r.method = http::string_to_verb(line.substr(0, space));
    std::string_view target =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    out.push_back(std::move(r));
  }
  return out;
}

// Real APIs with small limits, so that caps and evictions are reachable.
struct Apis {
  prometheus::Registry registry;
  BlobApi blobs;
  ManifestApi manifests;
  PrefetchApi prefetch;

  static BlobApiOptions BlobOptions() {
    BlobApiOptions o;
    o.table.chunk_size = 1u << 20;
    o.table.piece_size = 256u << 10;
    o.table.target_chunks = 4;
    o.table.min_chunk_size = 64u << 10;
    o.table.first_chunk_size = 16u << 10;
    o.table.max_upstream_fetchers = 3;
    o.table.max_leases_per_blob = 2;
    o.table.head_start = std::chrono::milliseconds(1500);
    o.table.max_blobs = 4;
    o.table.max_chunks_per_blob = 4096;
    o.table.max_chunks = 8192;
    return o;
  }
  static ManifestApiOptions ManifestOptions() {
    ManifestApiOptions o;
    o.cache.max_manifests = 4;
    return o;
  }
  static PrefetchApiOptions PrefetchOptions() {
    PrefetchApiOptions o;
    o.jobs.max_jobs = 4;
    o.jobs.max_agents = 8;
    return o;
  }

  Apis()
      : blobs(BlobOptions(), registry, std::string(kTrackerId), 1),
        manifests(ManifestOptions(), registry, std::string(kTrackerId), 3),
        prefetch(PrefetchOptions(), registry, std::string(kTrackerId), 2) {}

  // Routes like tracker/server.cc: nullopt for a path none of the APIs owns.
  std::optional<BlobResponse> Handle(const Request& r, TimePoint now, bool& blob_api) {
    BlobRequest req{r.method, r.path, r.query, r.body};
    blob_api = BlobApi::Owns(r.path);
    if (blob_api) return blobs.HandleNow(req, now);
    if (ManifestApi::Owns(r.path)) return manifests.HandleNow(req, now);
    if (PrefetchApi::Owns(r.path)) return prefetch.HandleNow(req, now);
    return std::nullopt;
  }
};

void CheckAnswer(const BlobResponse& a) {
  const unsigned s = a.status;
  FUZZ_CHECK((s >= 200 && s < 300) || (s >= 400 && s < 500) || s == 503);
  nlohmann::json j = nlohmann::json::parse(a.body, nullptr, false);
  FUZZ_CHECK(j.is_object());
  FUZZ_CHECK(j.contains("tracker_id") && j["tracker_id"] == kTrackerId);
  if (s >= 400) {
    FUZZ_CHECK(j.contains("error") && j["error"].is_string());
    FUZZ_CHECK(!j["error"].get<std::string>().empty());
  }
  if (s == 405) FUZZ_CHECK(!a.allow.empty());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // the APIs log every lease and job: noise at 1000s/s
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<Request> requests = Split(text);
  Apis first, second;
  TimePoint now = kT0;
  for (const Request& r : requests) {
    now += std::chrono::seconds(1);
    bool blob_api = false;
    auto a = first.Handle(r, now, blob_api);
    auto b = second.Handle(r, now, blob_api);
    FUZZ_CHECK(a.has_value() == b.has_value());
    if (!a) continue;
    CheckAnswer(*a);
    FUZZ_CHECK(a->status == b->status);
    FUZZ_CHECK(a->body == b->body);
    FUZZ_CHECK(a->allow == b->allow);
  }
  for (TimePoint t : {now + std::chrono::seconds(20), now + std::chrono::hours(2)}) {
    first.blobs.Sweep(t);
    first.manifests.Sweep(t);
    first.prefetch.Sweep(t);
    FUZZ_CHECK(!first.blobs.StatusSection(t).empty());
    FUZZ_CHECK(!first.manifests.StatusSection().empty());
    FUZZ_CHECK(!first.prefetch.StatusSection(t).empty());
  }
  return 0;
}
