// The tracker's cluster-wide manifest cache (tracker/manifests/manifest_cache.*) with a fake clock, and
// its JSON API (tracker/manifests/manifest_api.*) through HandleNow: TTL, single-flight fetch leases,
// lease expiry passing the fetch on, digest verification on publish, LRU bounds.

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <utility>

#include <prometheus/registry.h>
#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "lib/core/sha256.h"
#include "tracker/manifests/manifest_api.h"
#include "tracker/manifests/manifest_cache.h"

namespace shoal::tracker {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
namespace http = boost::beast::http;
using Kind = ManifestAnswer::Kind;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);
constexpr char kType[] = "application/vnd.oci.image.manifest.v1+json";

ManifestCacheOptions Options() {
  ManifestCacheOptions o;
  o.tag_ttl = seconds(30);
  o.lease_ttl = seconds(10);
  return o;
}

std::string Body(int n) {
  return R"({"schemaVersion":2,"mediaType":")" + std::string(kType) + R"(","n":)" +
         std::to_string(n) + "}";
}

const std::string kTag = ManifestCache::ManifestKey("r.test", "a/b", "1", false);

// Publishes as the holder of key's fetch lease (taking one as "publisher" when nobody holds
// it; an empty key stores under the digest's own reference), as an agent would.
PublishErrc PublishAsHolder(ManifestCache& cache, const Digest& d, const std::string& type,
                            const std::string& body, std::string key, bool is_tag, TimePoint now) {
  if (key.empty()) key = ManifestCache::ManifestKey("r.test", "a/b", d.str(), true);
  if (!cache.LeaseOf(key)) cache.Resolve(key, is_tag ? nullptr : &d, "publisher", now);
  auto lease = cache.LeaseOf(key);
  REQUIRE(lease.has_value());
  return cache.Publish(d, type, body, key, is_tag, lease->first, lease->second, now);
}

// The lease id agent would quote: its own, or a wrong one when it does not hold the lease.
std::string IdOf(const ManifestCache& cache, const std::string& key, const std::string& agent) {
  auto lease = cache.LeaseOf(key);
  return lease && lease->first == agent ? lease->second : "not-the-lease";
}

}  // namespace

TEST_CASE("tracker manifest cache: the first asker fetches, a publish serves everyone") {
  ManifestCache cache(Options());
  ManifestAnswer a = cache.Resolve(kTag, nullptr, "node-1", kT0);
  CHECK(a.kind == Kind::kFetch);
  CHECK(a.lease_ttl == seconds(10));
  // Single flight: everyone else waits until the lease's expiry at the latest.
  for (const char* agent : {"node-2", "node-3", "node-4"}) {
    ManifestAnswer w = cache.Resolve(kTag, nullptr, agent, kT0 + seconds(1));
    CHECK(w.kind == Kind::kWait);
    CHECK(w.recheck_at == kT0 + seconds(10));
  }
  // The lease holder asking again keeps its lease.
  CHECK(cache.Resolve(kTag, nullptr, "node-1", kT0 + seconds(1)).kind == Kind::kFetch);
  CHECK(cache.totals().leases == 1);

  std::string body = Body(1);
  Digest d = Sha256::Of(body);
  CHECK(PublishAsHolder(cache, d, kType, body, kTag, true, kT0 + seconds(2)) == PublishErrc::kOk);
  CHECK(cache.totals().leases == 0);
  ManifestAnswer f = cache.Resolve(kTag, nullptr, "node-2", kT0 + seconds(3));
  REQUIRE(f.kind == Kind::kFound);
  CHECK(f.manifest->digest == d);
  CHECK(f.manifest->body == body);
  CHECK(f.manifest->media_type == kType);
  CHECK(f.age == seconds(1));
  // The digest reference is served from the same bytes, whatever the repository.
  std::string by_digest = ManifestCache::ManifestKey("r.test", "c/d", d.str(), true);
  CHECK(cache.Resolve(by_digest, &d, "node-5", kT0 + seconds(3)).kind == Kind::kFound);
}

TEST_CASE("tracker manifest cache: a tag expires after the TTL and one agent fetches it again") {
  ManifestCache cache(Options());
  std::string body = Body(1);
  Digest d = Sha256::Of(body);
  REQUIRE(cache.Resolve(kTag, nullptr, "node-1", kT0).kind == Kind::kFetch);
  REQUIRE(PublishAsHolder(cache, d, kType, body, kTag, true, kT0) == PublishErrc::kOk);
  CHECK(cache.Resolve(kTag, nullptr, "node-2", kT0 + seconds(29)).kind == Kind::kFound);
  ManifestAnswer again = cache.Resolve(kTag, nullptr, "node-2", kT0 + seconds(30));
  CHECK(again.kind == Kind::kFetch);
  CHECK(cache.Resolve(kTag, nullptr, "node-3", kT0 + seconds(31)).kind == Kind::kWait);
  // Digests never expire.
  std::string by_digest = ManifestCache::ManifestKey("r.test", "a/b", d.str(), true);
  CHECK(cache.Resolve(by_digest, &d, "node-3", kT0 + std::chrono::hours(24)).kind == Kind::kFound);
  // The new resolution may point elsewhere.
  std::string body2 = Body(2);
  Digest d2 = Sha256::Of(body2);
  REQUIRE(PublishAsHolder(cache, d2, kType, body2, kTag, true, kT0 + seconds(32)) ==
          PublishErrc::kOk);
  ManifestAnswer f = cache.Resolve(kTag, nullptr, "node-3", kT0 + seconds(33));
  REQUIRE(f.kind == Kind::kFound);
  CHECK(f.manifest->digest == d2);
}

TEST_CASE("tracker manifest cache: an expired fetch lease passes to the next asker") {
  ManifestCache cache(Options());
  REQUIRE(cache.Resolve(kTag, nullptr, "node-1", kT0).kind == Kind::kFetch);
  CHECK(cache.Resolve(kTag, nullptr, "node-2", kT0 + milliseconds(9999)).kind == Kind::kWait);
  ManifestAnswer taken = cache.Resolve(kTag, nullptr, "node-2", kT0 + seconds(10));
  CHECK(taken.kind == Kind::kFetch);
  CHECK(taken.took_over);
  // node-1 is now a waiter like any other.
  CHECK(cache.Resolve(kTag, nullptr, "node-1", kT0 + seconds(11)).kind == Kind::kWait);
  // A release hands the fetch on at once; a release by a non-holder does nothing.
  CHECK_FALSE(cache.Release(kTag, "node-1", IdOf(cache, kTag, "node-1")));
  CHECK(cache.Release(kTag, "node-2", IdOf(cache, kTag, "node-2")));
  ManifestAnswer next = cache.Resolve(kTag, nullptr, "node-3", kT0 + seconds(12));
  CHECK(next.kind == Kind::kFetch);
  CHECK_FALSE(next.took_over);
  // The sweep drops expired leases.
  CHECK(cache.Sweep(kT0 + seconds(30)) == 1);
  CHECK(cache.totals().leases == 0);
}

TEST_CASE("tracker manifest cache: a publish whose bytes do not hash to the digest is refused") {
  ManifestCache cache(Options());
  REQUIRE(cache.Resolve(kTag, nullptr, "node-1", kT0).kind == Kind::kFetch);
  Digest other = Sha256::Of(Body(2));
  CHECK(PublishAsHolder(cache, other, kType, Body(1), kTag, true, kT0) ==
        PublishErrc::kDigestMismatch);
  CHECK(cache.totals().manifests == 0);
  CHECK(cache.totals().tags == 0);
  CHECK(cache.totals().leases == 1);  // the fetcher still holds it
  CHECK(cache.Resolve(kTag, nullptr, "node-2", kT0).kind == Kind::kWait);
  CHECK(PublishAsHolder(cache, Sha256::Of(""), kType, "", kTag, true, kT0) ==
        PublishErrc::kInvalid);
  ManifestCacheOptions small = Options();
  small.max_manifest_bytes = 8;
  ManifestCache limited(small);
  CHECK(PublishAsHolder(limited, Sha256::Of(Body(1)), kType, Body(1), kTag, true, kT0) ==
        PublishErrc::kTooLarge);
}

TEST_CASE("tracker manifest cache: manifests are bounded by count and bytes, least recent first") {
  ManifestCacheOptions o = Options();
  o.max_manifests = 3;
  ManifestCache cache(o);
  std::vector<Digest> d;
  for (int i = 0; i < 3; ++i) {
    d.push_back(Sha256::Of(Body(i)));
    REQUIRE(PublishAsHolder(cache, d[i], kType, Body(i), "", false, kT0) == PublishErrc::kOk);
  }
  CHECK(cache.Find(d[0]) != nullptr);  // d[1] is now the least recently used
  d.push_back(Sha256::Of(Body(3)));
  REQUIRE(PublishAsHolder(cache, d[3], kType, Body(3), "", false, kT0) == PublishErrc::kOk);
  CHECK(cache.totals().manifests == 3);
  CHECK(cache.Find(d[1]) == nullptr);
  CHECK(cache.Find(d[0]) != nullptr);
  CHECK(cache.Find(d[2]) != nullptr);
  CHECK(cache.Find(d[3]) != nullptr);
  // Bytes: a bound that holds two bodies keeps the two most recent.
  ManifestCacheOptions b = Options();
  b.max_bytes = 2 * Body(0).size();
  ManifestCache by_bytes(b);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(PublishAsHolder(by_bytes, d[i], kType, Body(i), "", false, kT0) == PublishErrc::kOk);
  }
  CHECK(by_bytes.totals().manifests == 2);
  CHECK(by_bytes.totals().bytes == 2 * Body(0).size());
  CHECK(by_bytes.Find(d[0]) == nullptr);
  // A tag whose manifest was evicted is fetched again.
  ManifestCache one([] {
    ManifestCacheOptions x = Options();
    x.max_manifests = 1;
    return x;
  }());
  REQUIRE(PublishAsHolder(one, d[0], kType, Body(0), kTag, true, kT0) == PublishErrc::kOk);
  REQUIRE(PublishAsHolder(one, d[1], kType, Body(1), "", false, kT0) == PublishErrc::kOk);
  CHECK(one.Resolve(kTag, nullptr, "node-1", kT0).kind == Kind::kFetch);
}

namespace {

struct Api {
  prometheus::Registry registry;
  ManifestApi api{ManifestApiOptions{Options()}, registry, "0123456789abcdef"};

  std::pair<unsigned, json> Call(http::verb method, std::string_view path, std::string_view body,
                                 TimePoint now = kT0, std::string_view query = "") {
    BlobResponse r = api.HandleNow(BlobRequest{method, path, query, body}, now);
    json j = json::parse(r.body, nullptr, false);
    REQUIRE_MESSAGE(j.is_object(), r.body);
    CHECK(j.value("tracker_id", "") == "0123456789abcdef");
    return {r.status, j};
  }
};

std::string Ref(const std::string& agent, const std::string& reference = "1") {
  return json{
      {"agent", agent}, {"registry", "r.test"}, {"repository", "a/b"}, {"reference", reference}}
      .dump();
}

}  // namespace

TEST_CASE("tracker manifest api: resolve, publish with verification, then found") {
  Api a;
  CHECK(ManifestApi::Owns("/v1/manifests/resolve"));
  CHECK_FALSE(ManifestApi::Owns("/v1/manifestsx"));
  auto [s1, j1] = a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-1"));
  CHECK(s1 == 200);
  CHECK(j1["state"] == "fetch");
  auto [s2, j2] = a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-2"));
  CHECK(j2["state"] == "wait");
  CHECK(j2["retry_after_ms"].get<int64_t>() > 0);

  std::string body = Body(1);
  Digest d = Sha256::Of(body);
  json pub = json::parse(Ref("node-1"));
  pub["media_type"] = kType;
  pub["manifest"] = Base64Encode(body);
  // Only the lease holder publishes: without the lease id, or as another agent, 403.
  auto [s0, j0] = a.Call(http::verb::put, "/v1/manifests/" + d.str(), pub.dump());
  CHECK(s0 == 403);
  CHECK(j0["error"].get<std::string>().find("fetch lease") != std::string::npos);
  pub["lease_id"] = j1["lease_id"];
  json thief = pub;
  thief["agent"] = "node-2";
  CHECK(a.Call(http::verb::put, "/v1/manifests/" + d.str(), thief.dump()).first == 403);
  pub["manifest"] = Base64Encode(Body(2));  // not the bytes of d
  auto [s3, j3] = a.Call(http::verb::put, "/v1/manifests/" + d.str(), pub.dump());
  CHECK(s3 == 400);
  CHECK(j3["error"].get<std::string>().find("do not hash") != std::string::npos);
  pub["manifest"] = Base64Encode(body);
  auto [s4, j4] = a.Call(http::verb::put, "/v1/manifests/" + d.str(), pub.dump());
  CHECK(s4 == 200);
  auto [s5, j5] =
      a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-2"), kT0, "wait_ms=0");
  CHECK(j5["state"] == "found");
  CHECK(j5["digest"] == d.str());
  CHECK(j5["media_type"] == kType);
  CHECK(Base64Decode(j5["manifest"].get<std::string>()) == body);
  auto [s6, j6] = a.Call(http::verb::get, "/v1/manifests/" + d.str(), "");
  CHECK(s6 == 200);
  auto [s7, j7] = a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-2", d.str()));
  CHECK(j7["state"] == "found");
}

TEST_CASE("tracker manifest api: bad requests get 4xx with a message") {
  Api a;
  CHECK(a.Call(http::verb::post, "/v1/manifests/resolve", "").first == 400);
  CHECK(a.Call(http::verb::post, "/v1/manifests/resolve", "[1]").first == 400);
  CHECK(a.Call(http::verb::post, "/v1/manifests/resolve", R"({"agent":1e999})").first == 400);
  CHECK(a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-1", "bad tag!")).first == 400);
  CHECK(a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-1", "sha256:12")).first == 400);
  CHECK(a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-1"), kT0, "wait_ms=x").first ==
        400);
  CHECK(a.Call(http::verb::get, "/v1/manifests/resolve", "").first == 405);
  // A 405 names the methods the path takes (the server sends them as Allow).
  CHECK(a.api.HandleNow(BlobRequest{http::verb::get, "/v1/manifests/release", "", ""}, kT0).allow ==
        "POST");
  CHECK(a.api
            .HandleNow(
                BlobRequest{http::verb::post, "/v1/manifests/" + Sha256::Of("x").str(), "", "{}"},
                kT0)
            .allow == "GET, HEAD, PUT");
  CHECK(a.Call(http::verb::get, "/v1/manifests/sha256:zz", "").first == 400);
  CHECK(a.Call(http::verb::get, "/v1/manifests/" + Sha256::Of("x").str(), "").first == 404);
  CHECK(a.Call(http::verb::get, "/v1/manifests/a/b", "").first == 404);
  auto [s, j] = a.Call(http::verb::post, "/v1/manifests/release", Ref("node-1"));
  CHECK(s == 200);
  CHECK(j["released"] == false);
}

TEST_CASE("tracker manifest cache: an upstream 404 is answered to everyone for the missing TTL") {
  ManifestCacheOptions o = Options();
  o.missing_ttl = seconds(10);
  ManifestCache cache(o);
  REQUIRE(cache.Resolve(kTag, nullptr, "node-1", kT0).kind == Kind::kFetch);
  CHECK(cache.Resolve(kTag, nullptr, "node-2", kT0).kind == Kind::kWait);
  // node-1's fetch found nothing: its lease ends and everyone hears "missing" at once.
  CHECK(cache.ReleaseMissing(kTag, "node-1", IdOf(cache, kTag, "node-1"), "manifest unknown",
                             kT0 + seconds(1)));
  CHECK(cache.totals().leases == 0);
  CHECK(cache.totals().missing == 1);
  for (const char* agent : {"node-1", "node-2", "node-3"}) {
    ManifestAnswer m = cache.Resolve(kTag, nullptr, agent, kT0 + seconds(5));
    CHECK(m.kind == Kind::kMissing);
    CHECK(m.missing == "manifest unknown");
    CHECK(m.age == seconds(4));
  }
  // Other references are not affected.
  const std::string other = ManifestCache::ManifestKey("r.test", "a/b", "2", false);
  CHECK(cache.Resolve(other, nullptr, "node-2", kT0 + seconds(5)).kind == Kind::kFetch);
  // After the TTL one agent asks upstream again (the tag may have been pushed since).
  CHECK(cache.Resolve(kTag, nullptr, "node-2", kT0 + seconds(11)).kind == Kind::kFetch);
  CHECK(cache.totals().missing == 0);
  // The miss is remembered again, and forgotten when a later fetch publishes the tag.
  CHECK(cache.ReleaseMissing(kTag, "node-2", IdOf(cache, kTag, "node-2"), "manifest unknown",
                             kT0 + seconds(12)));
  CHECK(cache.Resolve(kTag, nullptr, "node-3", kT0 + seconds(13)).kind == Kind::kMissing);
  REQUIRE(cache.Resolve(kTag, nullptr, "node-3", kT0 + seconds(23)).kind == Kind::kFetch);
  std::string body = Body(7);
  REQUIRE(PublishAsHolder(cache, Sha256::Of(body), kType, body, kTag, true, kT0 + seconds(23)) ==
          PublishErrc::kOk);
  CHECK(cache.Resolve(kTag, nullptr, "node-4", kT0 + seconds(23)).kind == Kind::kFound);
  // Sweep drops expired misses.
  // Only the lease holder's "not found" counts: node-9 holds no lease on `other`, node-2 does.
  CHECK_FALSE(cache.ReleaseMissing(other, "node-9", IdOf(cache, other, "node-9"), "name unknown",
                                   kT0 + seconds(20)));
  CHECK(cache.totals().missing == 0);
  CHECK(cache.ReleaseMissing(other, "node-2", IdOf(cache, other, "node-2"), "name unknown",
                             kT0 + seconds(20)));
  CHECK(cache.totals().missing == 1);
  cache.Sweep(kT0 + seconds(31));
  CHECK(cache.totals().missing == 0);
}

TEST_CASE("tracker manifest cache: with a missing TTL of 0 a 404 is not remembered") {
  ManifestCacheOptions o = Options();
  o.missing_ttl = seconds(0);
  ManifestCache cache(o);
  REQUIRE(cache.Resolve(kTag, nullptr, "node-1", kT0).kind == Kind::kFetch);
  CHECK(cache.ReleaseMissing(kTag, "node-1", IdOf(cache, kTag, "node-1"), "manifest unknown", kT0));
  CHECK(cache.Resolve(kTag, nullptr, "node-2", kT0).kind == Kind::kFetch);
}

TEST_CASE(
    "tracker manifest api: a release with \"missing\" answers \"missing\" to the next askers") {
  Api a;
  auto [s1, j1] = a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-1"));
  REQUIRE(j1["state"] == "fetch");
  json rel = json::parse(Ref("node-1"));
  rel["lease_id"] = j1["lease_id"];
  // Another agent's "not found" is not believed (it would make the cluster answer 404).
  json other = json::parse(Ref("node-9"));
  other["missing"] = "manifest unknown";
  auto [so, jo] = a.Call(http::verb::post, "/v1/manifests/release", other.dump());
  CHECK(so == 200);
  CHECK(jo["released"] == false);
  CHECK(jo["missing"] == false);
  rel["missing"] = std::string(2000, 'x');  // too long
  CHECK(a.Call(http::verb::post, "/v1/manifests/release", rel.dump()).first == 400);
  rel["missing"] = "manifest unknown: manifest tagged by \"1\" is not found";
  auto [s2, j2] = a.Call(http::verb::post, "/v1/manifests/release", rel.dump(), kT0);
  CHECK(s2 == 200);
  CHECK(j2["released"] == true);
  CHECK(j2["missing"] == true);
  auto [s3, j3] = a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-2"), kT0 + seconds(2),
                         "wait_ms=0");
  CHECK(s3 == 200);
  CHECK(j3["state"] == "missing");
  CHECK(j3["error"] == "manifest unknown: manifest tagged by \"1\" is not found");
  CHECK(j3["age_ms"] == 2000);
  // A plain release (a transient failure) is not remembered.
  json ref2 = json::parse(Ref("node-1", "2"));
  auto [s4, j4] = a.Call(http::verb::post, "/v1/manifests/resolve", ref2.dump());
  REQUIRE(j4["state"] == "fetch");
  ref2["lease_id"] = j4["lease_id"];
  CHECK(a.Call(http::verb::post, "/v1/manifests/release", ref2.dump()).second["released"] == true);
  CHECK(a.Call(http::verb::post, "/v1/manifests/resolve", Ref("node-2", "2")).second["state"] ==
        "fetch");
}

}  // namespace shoal::tracker
