// BlobApi without the network: request validation, JSON answers and status mapping
// (HandleNow; the long-poll is covered by tests/integration/tracker_lease_test.cc).

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/registry.h>
#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "lib/swarm/chunk_torrent.h"
#include "tracker/blobs/blob_api.h"

namespace shoal::tracker {
namespace {

using nlohmann::json;
using std::chrono::seconds;
namespace http = boost::beast::http;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);
const std::string kDigest = "sha256:" + std::string(64, 'a');
const std::string kBlob = "/v1/blobs/" + kDigest;
constexpr uint64_t kChunk = 64 << 10;
constexpr uint32_t kPiece = 16 << 10;
constexpr uint64_t kSize = 2 * kChunk + 100;

BlobApiOptions Options() {
  BlobApiOptions o;
  o.table.chunk_size = kChunk;
  o.table.piece_size = kPiece;
  o.table.max_upstream_fetchers = 4;
  return o;
}

std::string Metainfo(uint64_t length) {
  std::string data(length, 'x');
  swarm::PieceHasher hasher(length, kPiece);
  REQUIRE(hasher.Update(data.data(), data.size()).has_value());
  auto torrent = swarm::BuildChunkTorrent("c", length, kPiece, hasher.Finish().value());
  REQUIRE(torrent.has_value());
  return torrent.value().metainfo;
}

struct Api {
  prometheus::Registry registry;
  BlobApi api{Options(), registry, "0123456789abcdef", 7};

  // Answers and checks that the body is a JSON object carrying the tracker id.
  std::pair<unsigned, json> Call(http::verb method, std::string_view path, std::string_view query,
                                 std::string_view body, TimePoint now = kT0) {
    BlobResponse r = api.HandleNow(BlobRequest{method, path, query, body}, now);
    json j = json::parse(r.body, nullptr, false);
    REQUIRE_MESSAGE(j.is_object(), r.body);
    CHECK(j.value("tracker_id", "") == "0123456789abcdef");
    return {r.status, j};
  }
};

std::string SourceBody(const std::string& agent = "node-1", uint64_t size = kSize) {
  return json{{"agent", agent}, {"size", size}, {"registry", "r.test"}, {"repository", "a/b"}}
      .dump();
}

}  // namespace

TEST_CASE("tracker blobs api: routes are owned under /v1/blobs only") {
  CHECK(BlobApi::Owns("/v1/blobs"));
  CHECK(BlobApi::Owns("/v1/blobs/x"));
  CHECK_FALSE(BlobApi::Owns("/v1/blobsx"));
  CHECK_FALSE(BlobApi::Owns("/announce"));
  std::string id = BlobApi::NewTrackerId();
  CHECK(id.size() == 16);
  CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
}

TEST_CASE("tracker blobs api: create, lease, publish and read a table") {
  Api a;
  auto [created, table] = a.Call(http::verb::post, kBlob, "", SourceBody());
  REQUIRE(created == 200);
  CHECK(table["digest"] == kDigest);
  CHECK(table["size"] == kSize);
  CHECK(table["chunk_size"] == kChunk);
  CHECK(table["piece_size"] == kPiece);
  REQUIRE(table["chunks"].size() == 3);
  CHECK(table["chunks"][0]["state"] == "none");

  auto [s1, granted] =
      a.Call(http::verb::post, kBlob + "/chunks/2/lease", "wait_ms=0", SourceBody());
  REQUIRE(s1 == 200);
  CHECK(granted["state"] == "granted");
  CHECK(granted["begin"] == 2 * kChunk);
  CHECK(granted["length"] == 100);
  CHECK(granted["ttl_ms"] == 15000);
  CHECK(granted["size"] == kSize);
  std::string lease_id = granted["lease_id"];

  auto [s2, wait] = a.Call(http::verb::post, kBlob + "/chunks/2/lease", "", SourceBody("node-2"));
  CHECK(s2 == 200);
  CHECK(wait["state"] == "wait");
  CHECK(wait["reason"] == "leased");
  CHECK(wait["retry_after_ms"].get<int>() > 0);
  CHECK(wait["chunk_size"] == kChunk);

  auto [s3, renewed] =
      a.Call(http::verb::post, kBlob + "/chunks/2/renew", "",
             json{{"agent", "node-1"}, {"lease_id", lease_id}, {"bytes", 50}}.dump());
  CHECK(s3 == 200);
  CHECK(renewed["ttl_ms"] == 15000);

  std::string metainfo = Metainfo(100);
  json publish = json::parse(SourceBody());
  publish["lease_id"] = lease_id;
  publish["metainfo"] = Base64Encode(metainfo);
  auto [s4, ready] = a.Call(http::verb::put, kBlob + "/chunks/2", "", publish.dump());
  CHECK(s4 == 200);
  CHECK(ready["state"] == "ready");
  CHECK_FALSE(ready.contains("kept"));

  auto [s5, lease_ready] =
      a.Call(http::verb::post, kBlob + "/chunks/2/lease", "", SourceBody("node-2"));
  CHECK(s5 == 200);
  CHECK(lease_ready["state"] == "ready");
  CHECK(Base64Decode(lease_ready["metainfo"].get<std::string>()) == metainfo);

  auto [s6, got] = a.Call(http::verb::get, kBlob, "", "");
  CHECK(s6 == 200);
  CHECK(got["chunks"][2]["state"] == "ready");
  CHECK(Base64Decode(got["chunks"][2]["metainfo"].get<std::string>()) == metainfo);
  CHECK_FALSE(got["chunks"][0].contains("metainfo"));

  // A renewal after publication: the lease is gone.
  auto [s7, lost] = a.Call(http::verb::post, kBlob + "/chunks/2/renew", "",
                           json{{"agent", "node-1"}, {"lease_id", lease_id}, {"bytes", 1}}.dump());
  CHECK(s7 == 409);
  CHECK(lost["error"].get<std::string>().find("lease lost") == 0);

  auto info_hash = swarm::ParseChunkTorrent(metainfo, 100, kPiece).value().info_hash;
  // Bad reports: one source is counted, a second one drops the chunk.
  const std::string bad = json{{"agent", "node-2"}, {"info_hash", swarm::Sha1Hex(info_hash)}}.dump();
  auto report_from = [&](const char* ip) {
    BlobResponse r = a.api.HandleNow(BlobRequest{http::verb::post, kBlob + "/chunks/2/bad", "",
                                                 bad, boost::asio::ip::make_address(ip)},
                                     kT0);
    CHECK(r.status == 200);
    return json::parse(r.body);
  };
  json counted = report_from("10.0.0.2");
  CHECK(counted["dropped"] == false);
  CHECK(counted["reporters"] == 1);
  CHECK(counted["needed"] == 2);
  CHECK(report_from("10.0.0.2")["reporters"] == 1);
  json dropped = report_from("10.0.0.3");
  CHECK(dropped["dropped"] == true);
  CHECK(dropped["reporters"] == 2);
}

TEST_CASE("tracker blobs api: one ready poll answers every ready chunk it names, and never grants") {
  Api a;
  auto ready_body = [](std::vector<uint32_t> chunks, const std::string& agent = "node-2") {
    json j = json::parse(SourceBody(agent));
    j["chunks"] = chunks;
    return j.dump();
  };
  // Nothing is ready: wait (not granted, although nobody fetches chunk 0).
  auto [s1, wait] = a.Call(http::verb::post, kBlob + "/ready", "wait_ms=0", ready_body({0, 1, 2}));
  REQUIRE(s1 == 200);
  CHECK(wait["state"] == "wait");
  CHECK(wait["retry_after_ms"].get<int>() > 0);
  CHECK(wait["size"] == kSize);
  CHECK(wait["chunk_size"] == kChunk);
  CHECK(a.api.table().totals().blobs == 1);
  // node-1 fetches and publishes chunks 0 and 2.
  std::string meta0 = Metainfo(kChunk), meta2 = Metainfo(100);
  for (auto [k, meta] : {std::pair<uint32_t, std::string>{0, meta0}, {2, meta2}}) {
    auto [sl, lease] = a.Call(http::verb::post, kBlob + "/chunks/" + std::to_string(k) + "/lease",
                              "", SourceBody());
    REQUIRE(lease["state"] == "granted");
    json publish = json::parse(SourceBody());
    publish["lease_id"] = lease["lease_id"];
    publish["metainfo"] = Base64Encode(meta);
    auto [sp, published] =
        a.Call(http::verb::put, kBlob + "/chunks/" + std::to_string(k), "", publish.dump());
    REQUIRE(sp == 200);
  }
  // Both ready chunks in one answer, in the order asked; chunk 1 is not there.
  auto [s2, ready] = a.Call(http::verb::post, kBlob + "/ready", "", ready_body({2, 1, 0}));
  REQUIRE(s2 == 200);
  CHECK(ready["state"] == "ready");
  REQUIRE(ready["chunks"].size() == 2);
  CHECK(ready["chunks"][0]["chunk"] == 2);
  CHECK(Base64Decode(ready["chunks"][0]["metainfo"].get<std::string>()) == meta2);
  CHECK(ready["chunks"][1]["chunk"] == 0);
  CHECK(Base64Decode(ready["chunks"][1]["metainfo"].get<std::string>()) == meta0);
  // Only chunk 1 asked for: wait, and chunk 1 is still not leased to anyone.
  auto [s3, still] = a.Call(http::verb::post, kBlob + "/ready", "", ready_body({1}));
  CHECK(still["state"] == "wait");
  auto [s4, table] = a.Call(http::verb::get, kBlob, "", "");
  CHECK(table["chunks"][1]["state"] == "none");

  // Malformed: each a 400 naming what is wrong.
  json no_chunks = json::parse(SourceBody());
  json many = json::parse(ready_body({0}));
  many["chunks"] = std::vector<uint32_t>(65, 0);
  for (uint32_t i = 0; i < 65; ++i) many["chunks"][i] = i;
  json negative = json::parse(ready_body({0}));
  negative["chunks"] = json::array({0, -1});
  json text = json::parse(ready_body({0}));
  text["chunks"] = json::array({"0"});
  struct Case {
    std::string body, query, expect;
  } cases[] = {
      {no_chunks.dump(), "", "\"chunks\" must be an array of 1 to 64"},
      {ready_body({}), "", "\"chunks\" must be an array of 1 to 64"},
      {many.dump(), "", "\"chunks\" must be an array of 1 to 64"},
      {negative.dump(), "", "not a non-negative integer"},
      {text.dump(), "", "not a non-negative integer"},
      {ready_body({1, 1}), "", "names chunk 1 twice"},
      {ready_body({0, 3}), "", "out of range"},
      {ready_body({0}), "wait_ms=later", "wait_ms"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    auto reply = a.Call(http::verb::post, kBlob + "/ready", c.query, c.body);
    CHECK(reply.first == 400);
    CHECK_MESSAGE(reply.second.value("error", "").find(c.expect) != std::string::npos,
                  reply.second.dump());
  }
  BlobResponse r = a.api.HandleNow(BlobRequest{http::verb::get, kBlob + "/ready", "", ""}, kT0);
  CHECK(r.status == 405);
  CHECK(r.allow == "POST");
}

TEST_CASE("tracker blobs api: release by query, 409 for a non-holder, 404 for unknown blobs") {
  Api a;
  auto [s1, granted] = a.Call(http::verb::post, kBlob + "/chunks/0/lease", "", SourceBody("n 1"));
  REQUIRE(s1 == 200);
  std::string id = granted["lease_id"];
  auto [s2, e2] =
      a.Call(http::verb::delete_, kBlob + "/chunks/0/lease", "agent=n2&lease_id=" + id, "");
  CHECK(s2 == 409);
  auto [s3, ok] =
      a.Call(http::verb::delete_, kBlob + "/chunks/0/lease", "agent=n%201&lease_id=" + id, "");
  CHECK(s3 == 200);
  CHECK(ok.size() == 1);  // just the tracker id
  auto [s4, e4] = a.Call(http::verb::get, "/v1/blobs/sha256:" + std::string(64, 'b'), "", "");
  CHECK(s4 == 404);
  CHECK(e4["error"].get<std::string>().find("not known") != std::string::npos);
  auto [s5, e5] =
      a.Call(http::verb::post, "/v1/blobs/sha256:" + std::string(64, 'b') + "/chunks/0/bad", "",
             json{{"agent", "n"}, {"info_hash", std::string(40, '0')}}.dump());
  CHECK(s5 == 200);
  CHECK(e5["dropped"] == false);
}

TEST_CASE("tracker blobs api: a percent-encoded digest in the path is accepted") {
  Api a;
  auto [status, table] =
      a.Call(http::verb::post, "/v1/blobs/sha256%3A" + std::string(64, 'a'), "", SourceBody());
  CHECK(status == 200);
  CHECK(table["digest"] == kDigest);
}

TEST_CASE("tracker blobs api: malformed requests get 400 with a precise message, never 500") {
  Api a;
  struct Case {
    http::verb method;
    std::string path;
    std::string query;
    std::string body;
    std::string expect;  // a part of the error message
  };
  std::string lease = kBlob + "/chunks/0/lease";
  json no_agent = json::parse(SourceBody());
  no_agent.erase("agent");
  json long_agent = json::parse(SourceBody(std::string(129, 'x')));
  json float_size = json::parse(SourceBody());
  float_size["size"] = 1.5;
  json zero_size = json::parse(SourceBody());
  zero_size["size"] = 0;
  json no_registry = json::parse(SourceBody());
  no_registry.erase("registry");
  json bad_b64 = json::parse(SourceBody());
  bad_b64["metainfo"] = "!!!";
  json garbage = json::parse(SourceBody());
  garbage["metainfo"] = Base64Encode("d4:infoi1ee");
  json wrong_length = json::parse(SourceBody());
  wrong_length["metainfo"] = Base64Encode(Metainfo(100));
  Case cases[] = {
      {http::verb::post, "/v1/blobs/sha256:abc/chunks/0/lease", "", SourceBody(), "digest"},
      {http::verb::post, "/v1/blobs/sha384:" + std::string(96, 'a'), "", SourceBody(),
       "not supported"},
      {http::verb::post, "/v1/blobs/%zz", "", SourceBody(), "percent-escape"},
      {http::verb::post, kBlob + "/chunks/-1/lease", "", SourceBody(), "chunk index"},
      {http::verb::post, kBlob + "/chunks/99999999999/lease", "", SourceBody(), "chunk index"},
      {http::verb::post, kBlob + "/chunks/7/lease", "", SourceBody(), "out of range"},
      {http::verb::post, lease, "wait_ms=soon", SourceBody(), "wait_ms"},
      {http::verb::post, lease, "wait_ms=1&wait_ms=2", SourceBody(), "twice"},
      {http::verb::post, lease, "", "{\"agent\":", "not valid JSON"},
      {http::verb::post, lease, "", "[1,2]", "not a JSON object"},
      {http::verb::post, lease, "", "", "empty"},
      {http::verb::post, lease, "", no_agent.dump(), "\"agent\""},
      {http::verb::post, lease, "", long_agent.dump(), "at most 128"},
      {http::verb::post, lease, "", float_size.dump(), "\"size\""},
      {http::verb::post, lease, "", zero_size.dump(), "\"size\""},
      {http::verb::post, lease, "", no_registry.dump(), "\"registry\""},
      {http::verb::post, kBlob + "/chunks/0/renew", "", json{{"agent", "n"}, {"bytes", 1}}.dump(),
       "\"lease_id\""},
      {http::verb::put, kBlob + "/chunks/0", "", json::parse(SourceBody()).dump(), "\"metainfo\""},
      {http::verb::put, kBlob + "/chunks/0", "", bad_b64.dump(), "base64"},
      {http::verb::put, kBlob + "/chunks/0", "", garbage.dump(), "metainfo of chunk 0"},
      {http::verb::put, kBlob + "/chunks/0", "", wrong_length.dump(), "bytes long"},
      {http::verb::post, kBlob + "/chunks/0/bad", "",
       json{{"agent", "n"}, {"info_hash", "xyz"}}.dump(), "info_hash"},
      {http::verb::delete_, lease, "agent=n", "", "lease_id"},
      {http::verb::delete_, lease, "agent=%0&lease_id=x", "", "percent-escape"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.path);
    CAPTURE(c.query);
    CAPTURE(c.body);
    // No structured binding: clang 14 cannot capture one in CHECK_MESSAGE's lambda.
    auto reply = a.Call(c.method, c.path, c.query, c.body);
    const json& j = reply.second;
    CHECK(reply.first == 400);
    CHECK_MESSAGE(j.value("error", "").find(c.expect) != std::string::npos, j.dump());
  }
  CHECK(a.api.table().totals().blobs == 0);
}

TEST_CASE("tracker blobs api: unknown endpoints are 404, wrong methods 405 with Allow") {
  Api a;
  auto [s1, e1] = a.Call(http::verb::post, kBlob + "/chunks/0/steal", "", "{}");
  CHECK(s1 == 404);
  auto [s2, e2] = a.Call(http::verb::get, kBlob + "/chunks", "", "");
  CHECK(s2 == 404);
  auto [s3, e3] = a.Call(http::verb::post, kBlob + "/", "", "{}");
  CHECK(s3 == 404);
  BlobResponse r =
      a.api.HandleNow(BlobRequest{http::verb::get, kBlob + "/chunks/0/lease", "", ""}, kT0);
  CHECK(r.status == 405);
  CHECK(r.allow == "POST, DELETE");
}

TEST_CASE("tracker blobs api: a size conflict is 409 and a full tracker 503") {
  prometheus::Registry registry;
  BlobApiOptions o = Options();
  o.table.max_blobs = 1;
  BlobApi api(o, registry, "id", 1);
  auto call = [&](const std::string& path, const std::string& body) {
    return api.HandleNow(BlobRequest{http::verb::post, path, "", body}, kT0);
  };
  CHECK(call(kBlob + "/chunks/0/lease", SourceBody()).status == 200);
  CHECK(call(kBlob, SourceBody("n", kSize + 1)).status == 409);
  BlobResponse full = call("/v1/blobs/sha256:" + std::string(64, 'c'), SourceBody());
  CHECK(full.status == 503);
  CHECK(full.body.find("tracker is full") != std::string::npos);
}

}  // namespace shoal::tracker

namespace shoal::tracker {

// Issue 14: every accepted bad report makes the cluster fetch the chunk upstream again, and
// anyone could send them. They are limited per source address (a client cannot forge it).
TEST_CASE("tracker blobs api: bad reports are limited per source address, with 429 and a metric") {
  Api a;
  const auto from = [](const char* ip) { return boost::asio::ip::make_address(ip); };
  const std::string path = kBlob + "/chunks/0/bad";
  const std::string body = json{{"agent", "n"}, {"info_hash", std::string(40, '0')}}.dump();
  auto report = [&](const char* ip, TimePoint now) {
    return a.api.HandleNow(BlobRequest{http::verb::post, path, "", body, from(ip)}, now).status;
  };
  for (int i = 0; i < 6; ++i) CHECK(report("10.0.0.7", kT0) == 200);
  BlobResponse limited =
      a.api.HandleNow(BlobRequest{http::verb::post, path, "", body, from("10.0.0.7")}, kT0);
  CHECK(limited.status == 429);
  CHECK(limited.body.find("too many bad-chunk reports from 10.0.0.7") != std::string::npos);
  CHECK(report("10.0.0.8", kT0) == 200);                // another node is not affected
  CHECK(report("10.0.0.7", kT0 + seconds(10)) == 200);  // one more every 10 s
  CHECK(report("10.0.0.7", kT0 + seconds(10)) == 429);
  auto collected = a.registry.Collect();
  double counted = 0;
  for (const auto& family : collected) {
    if (family.name == "shoal_tracker_bad_reports_limited_total") {
      counted = family.metric.at(0).counter.value;
    }
  }
  CHECK(counted == 2);
}

}  // namespace shoal::tracker

namespace shoal::tracker {

// Found by the tracker_api fuzzer under ASan: a number too large for a double ("313e540") threw
// nlohmann's out_of_range past the parse_error handler, and the request got no answer.
TEST_CASE("tracker blobs api: a JSON number out of range is a 400, not an exception") {
  Api a;
  auto reply = a.Call(http::verb::post, kBlob, "", R"({"agent":"n","size":313e540})");
  CHECK(reply.first == 400);
  CHECK(reply.second.value("error", "").find("not valid JSON") != std::string::npos);
}

}  // namespace shoal::tracker
