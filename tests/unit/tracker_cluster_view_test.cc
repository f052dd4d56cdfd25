// The cluster view's images (GET /v1/cluster "images"): each recently resolved image manifest
// joined with its blobs' chunk tables and swarms, with a fake clock.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/content_hash.h"
#include "lib/swarm/chunk_torrent.h"
#include "tracker/cluster/cluster_view.h"

#include "tests/support/why.h"

namespace shoal::tracker {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);
constexpr uint64_t kChunk = 64 << 10;
constexpr uint32_t kPiece = 16 << 10;
constexpr const char* kOciManifest = "application/vnd.oci.image.manifest.v1+json";
constexpr const char* kOciIndex = "application/vnd.oci.image.index.v1+json";

Digest D(char c) { return Digest::FromSha256Hex(std::string(64, c)); }
Digest D(int n) {
  std::string hex = std::to_string(n);
  return Digest::FromSha256Hex(std::string(64 - hex.size(), 'a') + hex);
}

struct Blob {
  Digest digest;
  uint64_t size = 0;
};

std::string Descriptor(const char* media_type, const Blob& b) {
  return json{{"mediaType", media_type}, {"digest", b.digest.str()}, {"size", b.size}}.dump();
}

// An OCI image manifest naming config and layers.
std::string ManifestBody(const Blob& config, const std::vector<Blob>& layers) {
  json j = {{"schemaVersion", 2}, {"mediaType", kOciManifest}};
  j["config"] = json::parse(Descriptor("application/vnd.oci.image.config.v1+json", config));
  j["layers"] = json::array();
  for (const Blob& l : layers) {
    j["layers"].push_back(
        json::parse(Descriptor("application/vnd.oci.image.layer.v1.tar+gzip", l)));
  }
  return j.dump();
}

Digest DigestOf(const std::string& body) {
  return ContentHash::Of(DigestAlgorithm::kSha256, body);
}

// Real chunk metainfo over `length` bytes derived from seed (distinct seeds, distinct torrents).
std::string Metainfo(uint64_t length, uint32_t seed) {
  std::string data(length, static_cast<char>('a' + seed % 26));
  REQUIRE(length >= sizeof(seed));
  std::memcpy(data.data(), &seed, sizeof(seed));
  swarm::PieceHasher hasher(length, kPiece);
  REQUIRE(hasher.Update(data.data(), data.size()).has_value());
  auto torrent = swarm::BuildChunkTorrent("chunk", length, kPiece, hasher.Finish().value());
  REQUIRE_MESSAGE(torrent.has_value(), Why(torrent));
  return torrent.value().metainfo;
}

PeerEndpoint Node(int n) {
  return PeerEndpoint::FromV4(
      {10, static_cast<uint8_t>(n >> 16), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)},
      6881);
}

// A replica's tables, and the helpers that make an image's pull happen in them.
struct World {
  BlobTable blobs;
  SwarmTable swarms{SwarmTableOptions{}, 1};
  ManifestCache manifests{ManifestCacheOptions{}, 1};
  PrefetchJobs prefetch{PrefetchJobsOptions{}, 1};
  ImageRates rates;
  std::map<Digest, std::vector<InfoHash>> chunks;  // published chunks' torrents, by blob
  uint32_t next_seed = 0;                          // each chunk published gets a torrent of its own

  World() : blobs(Options(), 1) {}

  static BlobTableOptions Options() {
    BlobTableOptions o;
    o.chunk_size = kChunk;
    o.piece_size = kPiece;
    o.max_upstream_fetchers = 1u << 20;
    o.max_leases_per_agent = 1u << 20;
    o.max_leases_per_blob = 1u << 20;
    return o;
  }

  // Publishes body under key (an agent fetched it upstream) and returns its digest.
  Digest PublishManifest(const std::string& key, const std::string& body, const char* media_type,
                         TimePoint now, bool is_tag = true) {
    Digest d = DigestOf(body);
    ManifestAnswer a = manifests.Resolve(key, is_tag ? nullptr : &d, "agent0", now);
    REQUIRE(a.kind == ManifestAnswer::Kind::kFetch);
    REQUIRE(manifests.Publish(d, media_type, body, key, is_tag, "agent0", a.lease_id, now) ==
            PublishErrc::kOk);
    return d;
  }

  // Every chunk of b fetched upstream under a lease by agent0 and published.
  void FetchUpstream(const Blob& b, TimePoint now) {
    BlobSource source{b.size, "registry.test", "team/app"};
    auto layout = blobs.LayoutFor(b.size);
    REQUIRE(layout.has_value());
    for (uint32_t k = 0; k < layout.value().chunk_count(); ++k) {
      auto lease = blobs.Lease(b.digest, k, "agent0", source, now);
      REQUIRE(lease.has_value());
      REQUIRE(lease.value().kind == LeaseAnswer::Kind::kGranted);
      auto published = blobs.Publish(b.digest, k, "agent0", lease.value().lease_id, source,
                                     Metainfo(layout.value().chunk_length(k), next_seed++), now);
      REQUIRE_MESSAGE(published.has_value(), Why(published));
      const swarm::Sha1& h = published.value().published->info_hash;
      chunks[b.digest].push_back(*InfoHash::FromBytes(
          std::string_view(reinterpret_cast<const char*>(h.data()), h.size())));
    }
  }

  // Node n announces every chunk of b: as a seeder, or as a leecher of them all.
  void Announce(int n, const Blob& b, bool seeder, TimePoint now) {
    AnnounceChunks(n, b, seeder ? chunks.at(b.digest).size() : 0, now);
  }

  // Node n seeds b's first `seeded` chunks and leeches the others.
  void AnnounceChunks(int n, const Blob& b, size_t seeded, TimePoint now) {
    const std::vector<InfoHash>& hashes = chunks.at(b.digest);
    for (size_t k = 0; k < hashes.size(); ++k) {
      const bool seeder = k < seeded;
      AnnounceRequest r;
      r.info_hash = hashes[k];
      r.peer_id = *PeerId::FromBytes("-XX0000-000000000000");
      r.port = 6881;
      r.left = seeder ? 0 : 1;
      r.event = seeder ? AnnounceEvent::kCompleted : AnnounceEvent::kStarted;
      r.numwant = 0;
      REQUIRE(swarms.Announce(r, Node(n), now).has_value());
    }
  }

  // Node n's agent polls for prefetch work, saying where its swarm listens.
  void Poll(int n, TimePoint now) {
    const std::string node = "node" + std::to_string(n);
    REQUIRE_FALSE(prefetch.Heartbeat(node, node + "-a", {}, now, nullptr, Node(n)).has_value());
  }

  json View(TimePoint now, const ClusterViewLimits& limits = {}) {
    ClusterViewInput in;
    in.tracker_id = "t1";
    in.blobs = &blobs;
    in.swarms = &swarms;
    in.prefetch = &prefetch;
    in.manifests = &manifests;
    in.rates = &rates;
    return BuildClusterView(in, now, limits);
  }
};

const Blob kConfig{D('c'), 1000};
const Blob kLayer1{D('1'), 3 * kChunk + 3392};  // four chunks
const Blob kLayer2{D('2'), 2000};

}  // namespace

TEST_CASE("cluster view: an image's size, bytes and nodes done come from its blobs' tables and "
          "swarms") {
  World w;
  const std::string body = ManifestBody(kConfig, {kLayer1, kLayer2});
  const Digest manifest = w.PublishManifest("registry.test/team/app:1", body, kOciManifest, kT0);
  const uint64_t size = kConfig.size + kLayer1.size + kLayer2.size;

  // Resolved, nothing fetched yet: the image is there with its size, and no blob is known.
  json v = w.View(kT0);
  REQUIRE(v["images"].size() == 1);
  json img = v["images"][0];
  CHECK(img["manifest"] == manifest.str());
  CHECK(img["references"] == json::array({"registry.test/team/app:1"}));
  CHECK(img["index"].is_null());
  CHECK(img["size"] == size);
  CHECK(img["blobs_total"] == 3);
  CHECK(img["blobs_known"] == 0);
  CHECK(img["nodes_done"] == 0);
  CHECK(img["complete"] == false);
  REQUIRE(img["blobs"].size() == 3);
  CHECK(img["blobs"][0]["kind"] == "config");
  CHECK(img["blobs"][0]["known"] == false);
  CHECK(img["blobs"][1]["digest"] == kLayer1.digest.str());

  // Node 0 fetched every blob upstream and seeds it; nodes 1 and 2 got it from peers; node 3
  // leeches layer 1.
  for (const Blob& b : {kConfig, kLayer1, kLayer2}) {
    w.FetchUpstream(b, kT0 + seconds(1));
    for (int n = 0; n < 3; ++n) w.Announce(n, b, true, kT0 + seconds(2));
  }
  w.Announce(3, kLayer1, false, kT0 + seconds(2));
  v = w.View(kT0 + seconds(10));
  img = v["images"][0];
  INFO(img.dump());
  CHECK(img["blobs_known"] == 3);
  CHECK(img["blobs_ready"] == 3);
  CHECK(img["upstream_bytes"] == size);
  CHECK(img["held_bytes"] == 3 * size);
  CHECK(img["peer_bytes"] == 2 * size);
  CHECK(img["nodes_done"] == 3);
  CHECK(img["nodes_in_progress"] == 1);
  CHECK(img["nodes_failed"] == 0);
  CHECK(img["complete"] == false);
  CHECK(img["age_ms"] == 10'000);  // since the manifest was stored
  CHECK(img["blobs"][1]["chunks"] == 4);
  CHECK(img["blobs"][1]["nodes_done"] == 3);
  CHECK(img["blobs"][1]["nodes_seen"] == 4);
  CHECK(img["blobs"][1]["upstream_bytes"] == kLayer1.size);
  // One node short of 4 x size, at the rate since the first view's sample at kT0: 3 x size in
  // 10 s.
  CHECK(img["rate_bytes_per_s"] == 3 * size / 10);
  CHECK(img["eta_ms"].get<int64_t>() > 3000);
  CHECK(img["eta_ms"].get<int64_t>() < 4000);
  // The blob list carries the same figures.
  CHECK(v["blobs"]["recent"][0]["peer_bytes"].is_number());

  // Node 3 completes everything: 4 nodes done, none in progress, the image complete.
  for (const Blob& b : {kConfig, kLayer1, kLayer2}) w.Announce(3, b, true, kT0 + seconds(12));
  img = w.View(kT0 + seconds(12))["images"][0];
  CHECK(img["nodes_done"] == 4);
  CHECK(img["nodes_in_progress"] == 0);
  CHECK(img["complete"] == true);
  CHECK(img["eta_ms"] == 0);
  // The rate is over the samples of the last minute: 4 x size in 12 s.
  CHECK(img["rate_bytes_per_s"] == 4 * size / 12);
}

TEST_CASE("cluster view: a node that lacks one blob of the image is not done with it") {
  World w;
  w.PublishManifest("registry.test/team/app:1", ManifestBody(kConfig, {kLayer1, kLayer2}),
                    kOciManifest, kT0);
  for (const Blob& b : {kConfig, kLayer1, kLayer2}) w.FetchUpstream(b, kT0);
  for (int n = 0; n < 2; ++n) {
    w.Announce(n, kConfig, true, kT0);
    w.Announce(n, kLayer1, true, kT0);
  }
  w.Announce(0, kLayer2, true, kT0);
  json img = w.View(kT0 + seconds(1))["images"][0];
  CHECK(img["nodes_done"] == 1);
  CHECK(img["nodes_in_progress"] == 1);
  CHECK(img["nodes_exact"] == true);

  // Node 1 now has layer 2 but not layer 1, node 0 has layer 1 but not layer 2: every chunk has
  // one seeder, yet neither node is done. Swarm counts alone would say one node done; each
  // node's peer entries say none.
  w.Announce(1, kLayer2, true, kT0 + seconds(2));
  AnnounceRequest stop;
  for (const InfoHash& ih : w.chunks.at(kLayer1.digest)) {
    stop.info_hash = ih;
    stop.port = 6881;
    stop.event = AnnounceEvent::kStopped;
    REQUIRE(w.swarms.Announce(stop, Node(1), kT0 + seconds(2)).has_value());
  }
  for (const InfoHash& ih : w.chunks.at(kLayer2.digest)) {
    stop.info_hash = ih;
    REQUIRE(w.swarms.Announce(stop, Node(0), kT0 + seconds(2)).has_value());
  }
  img = w.View(kT0 + seconds(3))["images"][0];
  INFO(img.dump());
  CHECK(img["nodes_done"] == 0);
  CHECK(img["nodes_in_progress"] == 2);
  CHECK(img["complete"] == false);
  CHECK(img["slowest_nodes"].size() == 2);
}

TEST_CASE(
    "cluster view: without a prefetch job, an image's slowest and stalled nodes come from "
    "their chunks in the swarms, named by their agents' polls") {
  World w;
  w.PublishManifest("registry.test/team/app:1", ManifestBody(kConfig, {kLayer1, kLayer2}),
                    kOciManifest, kT0);
  for (const Blob& b : {kConfig, kLayer1, kLayer2}) w.FetchUpstream(b, kT0);
  const uint64_t size = kConfig.size + kLayer1.size + kLayer2.size;
  // Nodes 0-2 poll with their swarm's endpoint; node 3 does not (an older agent) and is shown by
  // its peer address. Node 0 holds everything, node 1 the config and 3 of layer 1's 4 chunks,
  // node 2 the config and 1 chunk, node 3 the config and 2 chunks.
  for (int n = 0; n < 3; ++n) w.Poll(n, kT0);
  for (int n = 0; n < 4; ++n) w.Announce(n, kConfig, true, kT0);
  w.Announce(0, kLayer1, true, kT0);
  w.Announce(0, kLayer2, true, kT0);
  w.AnnounceChunks(1, kLayer1, 3, kT0);
  w.AnnounceChunks(2, kLayer1, 1, kT0);
  w.AnnounceChunks(3, kLayer1, 2, kT0);

  json img = w.View(kT0 + seconds(1))["images"][0];
  INFO(img.dump());
  CHECK(img["prefetch_job"].is_null());
  CHECK(img["nodes_exact"] == true);
  CHECK(img["nodes_done"] == 1);
  CHECK(img["nodes_in_progress"] == 3);
  CHECK(img["nodes_failed"] == 0);
  const json& slow = img["slowest_nodes"];
  REQUIRE(slow.size() == 3);  // the done node is not among them
  CHECK(slow[0]["node"] == "node2");
  CHECK(slow[0]["agent"] == "node2-a");
  CHECK(slow[0]["peer"] == Node(2).ToString());
  CHECK(slow[0]["state"] == "running");
  CHECK(slow[0]["chunks_held"] == 2);  // the config's chunk and layer 1's first
  CHECK(slow[0]["chunks_total"] == 6);
  CHECK(slow[0]["bytes_done"] == kConfig.size + kChunk);
  CHECK(slow[0]["bytes_total"] == size);
  CHECK(slow[0]["blobs_done"] == 1);
  CHECK(slow[0]["blobs_total"] == 3);
  CHECK(slow[0]["silent_ms"] == 1000);
  CHECK(slow[0]["error"] == "");
  CHECK(slow[1]["node"] == Node(3).ToString());  // no poll named it
  CHECK(slow[1]["agent"] == "");
  CHECK(slow[1]["chunks_held"] == 3);
  CHECK(slow[2]["node"] == "node1");
  CHECK(slow[2]["chunks_held"] == 4);

  // Nodes 0, 1 and 3 keep polling and announcing; node 2's agent stops polling (it died), so at
  // the agent TTL (30 s) node 2 is stalled, first, and counted failed.
  const TimePoint later = kT0 + seconds(31);
  for (int n : {0, 1}) w.Poll(n, later);
  for (int n = 0; n < 4; ++n) w.Announce(n, kConfig, true, later);
  img = w.View(later)["images"][0];
  CHECK(img["nodes_failed"] == 1);
  REQUIRE(img["slowest_nodes"].size() == 3);
  CHECK(img["slowest_nodes"][0]["node"] == "node2");
  CHECK(img["slowest_nodes"][0]["state"] == "stalled");
  CHECK(img["slowest_nodes"][0]["error"] == "its agent stopped polling 31 s ago");
  CHECK(img["slowest_nodes"][1]["state"] == "running");

  // Node 3 has no agent record: it is stalled once none of the image's chunks heard from it for
  // the announce silence (360 s by default), and node 1, announcing, is not.
  const TimePoint much_later = kT0 + seconds(400);
  for (int n : {0, 1}) {
    w.Poll(n, much_later);
    w.Announce(n, kConfig, true, much_later);
  }
  img = w.View(much_later)["images"][0];
  INFO(img.dump());
  CHECK(img["nodes_failed"] == 2);
  REQUIRE(img["slowest_nodes"].size() == 3);
  CHECK(img["slowest_nodes"][1]["node"] == Node(3).ToString());
  CHECK(img["slowest_nodes"][1]["state"] == "stalled");
  CHECK(img["slowest_nodes"][1]["error"] == "no announce of the image's chunks for 369 s");
  CHECK(img["slowest_nodes"][2]["node"] == "node1");
  CHECK(img["slowest_nodes"][2]["state"] == "running");

  // Beyond the view's budget of peer entries an image's nodes come from swarm counts alone.
  ClusterViewLimits limits;
  limits.peer_entries = 5;
  img = w.View(much_later, limits)["images"][0];
  CHECK(img["nodes_exact"] == false);
  CHECK(img["slowest_nodes"].empty());
  CHECK(img["nodes_failed"] == 0);
}

TEST_CASE("cluster view: an index stands for the platform manifests of it that nodes fetched") {
  World w;
  const std::string amd64 = ManifestBody(kConfig, {kLayer1});
  const std::string arm64 = ManifestBody(Blob{D('d'), 500}, {kLayer2});
  json index = {{"schemaVersion", 2}, {"mediaType", kOciIndex}, {"manifests", json::array()}};
  for (const auto& [body, arch] :
       std::vector<std::pair<std::string, std::string>>{{amd64, "amd64"}, {arm64, "arm64"}}) {
    index["manifests"].push_back({{"mediaType", kOciManifest},
                                  {"digest", DigestOf(body).str()},
                                  {"size", body.size()},
                                  {"platform", {{"os", "linux"}, {"architecture", arch}}}});
  }
  const Digest index_digest =
      w.PublishManifest("registry.test/team/app:multi", index.dump(), kOciIndex, kT0);
  // Only arm64 nodes pulled: the arm64 manifest is stored (by digest), the amd64 one is not.
  const Digest arm = w.PublishManifest("registry.test/team/app@" + DigestOf(arm64).str(), arm64,
                                       kOciManifest, kT0 + seconds(1), false);
  json images = w.View(kT0 + seconds(2))["images"];
  INFO(images.dump());
  REQUIRE(images.size() == 1);
  CHECK(images[0]["manifest"] == arm.str());
  CHECK(images[0]["index"] == index_digest.str());
  CHECK(images[0]["platform"] == "linux/arm64");
  CHECK(images[0]["size"] == 500 + kLayer2.size);
  const json& refs = images[0]["references"];
  CHECK(std::find(refs.begin(), refs.end(), "registry.test/team/app:multi") != refs.end());
  CHECK(std::find(refs.begin(), refs.end(),
                  "registry.test/team/app@" + DigestOf(arm64).str()) != refs.end());
}

TEST_CASE("cluster view: a prefetch job naming the image gives its failed and slowest nodes") {
  World w;
  w.PublishManifest("registry.test/team/app:1", ManifestBody(kConfig, {kLayer1}), kOciManifest,
                    kT0);
  for (const char* node : {"n1", "n2", "n3"}) {
    REQUIRE_FALSE(
        w.prefetch.Heartbeat(node, std::string(node) + "-a", {}, kT0, nullptr).has_value());
  }
  PrefetchSpec spec;
  spec.images = {"registry.test/team/app:1"};
  auto created = w.prefetch.Create(spec, kT0);
  REQUIRE(std::holds_alternative<const PrefetchJobRecord*>(created));
  const std::string id = std::get<const PrefetchJobRecord*>(created)->id;
  for (const char* node : {"n1", "n2", "n3"}) w.prefetch.Take(node, std::string(node) + "-a", kT0);
  auto report = [&](const char* node, PrefetchNodeState state, uint64_t done) {
    PrefetchReport r;
    r.agent = std::string(node) + "-a";
    r.state = state;
    r.bytes_done = done;
    r.bytes_total = 100;
    if (state == PrefetchNodeState::kFailed) r.error = "disk full";
    REQUIRE_FALSE(w.prefetch.Report(id, node, r, kT0 + seconds(1)).has_value());
  };
  report("n1", PrefetchNodeState::kDone, 100);
  report("n2", PrefetchNodeState::kRunning, 40);
  report("n3", PrefetchNodeState::kFailed, 10);
  json img = w.View(kT0 + seconds(2))["images"][0];
  INFO(img.dump());
  CHECK(img["prefetch_job"] == id);
  CHECK(img["nodes_failed"] == 1);
  REQUIRE(img["slowest_nodes"].size() == 2);  // the done node is not among them
  CHECK(img["slowest_nodes"][0]["node"] == "n3");
  CHECK(img["slowest_nodes"][0]["error"] == "disk full");
  CHECK(img["slowest_nodes"][1]["node"] == "n2");
}

TEST_CASE("cluster view: images are bounded, most recently resolved first") {
  World w;
  for (int i = 0; i < 15; ++i) {
    w.PublishManifest("registry.test/team/app:" + std::to_string(i),
                      ManifestBody(Blob{D(i), 100}, {kLayer2}), kOciManifest, kT0 + seconds(i));
  }
  ClusterViewLimits limits;
  limits.images = 4;
  limits.blobs_per_image = 1;
  json images = w.View(kT0 + seconds(20), limits)["images"];
  REQUIRE(images.size() == 4);
  CHECK(images[0]["references"][0] == "registry.test/team/app:14");
  CHECK(images[3]["references"][0] == "registry.test/team/app:11");
  CHECK(images[0]["blobs"].size() == 1);  // listed up to the bound
  CHECK(images[0]["blobs_total"] == 2);   // the figures cover every blob
  // A tag resolved again moves its image to the front.
  ManifestAnswer again =
      w.manifests.Resolve("registry.test/team/app:3", nullptr, "agent9", kT0 + seconds(21));
  REQUIRE(again.kind == ManifestAnswer::Kind::kFound);
  images = w.View(kT0 + seconds(22), limits)["images"];
  CHECK(images[0]["references"][0] == "registry.test/team/app:3");
}

TEST_CASE("cluster view: image rates come from the samples of the last window") {
  ImageRates rates(seconds(60), 2);
  const Digest a = D('a');
  CHECK_FALSE(rates.Sample(a, 0, kT0).has_value());
  CHECK_FALSE(rates.Sample(a, 50, kT0 + milliseconds(500)).has_value());  // under a second
  CHECK(*rates.Sample(a, 1000, kT0 + seconds(10)) == doctest::Approx(100.0));
  for (int s = 11; s <= 100; ++s) rates.Sample(a, 1000 + 10 * uint64_t(s - 10), kT0 + seconds(s));
  // Only the last minute counts: 10 bytes a second, not the early 100.
  CHECK(*rates.Sample(a, 1910, kT0 + seconds(101)) == doctest::Approx(10.0).epsilon(0.05));
  // At most 2 images: a third one drops the least recently sampled.
  rates.Sample(D('b'), 0, kT0 + seconds(102));
  rates.Sample(D('c'), 0, kT0 + seconds(103));
  CHECK(rates.size() == 2);
}

TEST_CASE("cluster view: built at 2,500 agents, a 2,500-node job and 10 images of 321 chunks") {
  World w;
  const TimePoint now = kT0 + seconds(10);  // the agents stay live (30 s)
  for (int n = 0; n < 2500; ++n) w.Poll(n, kT0);
  // 10 images, each a config and 5 layers of 64 chunks (the tracker's default target_chunks).
  // Swarm counts are O(1) per chunk whatever the swarm's size, and complete images are not read
  // peer by peer, so the peers only need to be there, not everywhere: the first image (a job
  // names it) has 2,500 on its first layer (half of them seeders), the second (pulled without a
  // job: each node's peer entries are read) 2,500 on every layer (node n seeds the first n % 65
  // chunks of each), the others' blobs 20.
  int next = 0;
  for (int i = 0; i < 10; ++i) {
    Blob config{D(++next), 1000};
    std::vector<Blob> layers;
    for (int l = 0; l < 5; ++l) layers.push_back(Blob{D(++next), 64 * kChunk});
    w.PublishManifest("registry.test/team/app" + std::to_string(i) + ":1",
                      ManifestBody(config, layers), kOciManifest, kT0 + seconds(i));
    w.FetchUpstream(config, kT0);
    for (const Blob& b : layers) w.FetchUpstream(b, kT0);
    for (int n = 0; n < 20; ++n) {
      w.Announce(n, config, true, kT0);
      for (const Blob& b : layers) w.Announce(n, b, true, kT0);
    }
    if (i == 0) {
      for (int n = 20; n < 2500; ++n) w.Announce(n, layers[0], n % 2 == 0, kT0);
    }
    if (i == 1) {
      for (int n = 20; n < 2500; ++n) {
        w.Announce(n, config, true, kT0);
        for (const Blob& b : layers) w.AnnounceChunks(n, b, n % 65, kT0);
      }
    }
  }
  PrefetchSpec spec;
  spec.images = {"registry.test/team/app0:1"};
  REQUIRE(std::holds_alternative<const PrefetchJobRecord*>(w.prefetch.Create(spec, kT0)));

  std::vector<double> ms;
  size_t bytes = 0;
  for (int round = 0; round < 9; ++round) {
    auto start = std::chrono::steady_clock::now();
    json v = w.View(now + seconds(round));
    std::string text = v.dump();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    bytes = text.size();
    REQUIRE(v["images"].size() == 10);
    const json& app0 = v["images"][9];  // resolved first, so shown last
    CHECK(app0["references"][0] == "registry.test/team/app0:1");
    CHECK(app0["nodes_done"] == 20);
    CHECK(app0["nodes_in_progress"] == 2500 - 20);
    CHECK(app0["slowest_nodes"].size() == 10);
    // Nodes 64, 129, ... hold every layer chunk: done with the 20 nodes that fetched it.
    const json& app1 = v["images"][8];
    CHECK(app1["prefetch_job"].is_null());
    CHECK(app1["nodes_exact"] == true);
    CHECK(app1["nodes_done"] == 20 + 38);
    CHECK(app1["nodes_in_progress"] == 2500 - 20 - 38);
    REQUIRE(app1["slowest_nodes"].size() == 10);
    CHECK(app1["slowest_nodes"][0]["node"] == "node1040");  // holds the config only: 1040 % 65 == 0
    CHECK(app1["slowest_nodes"][0]["chunks_held"] == 1);
    CHECK(v["agents"]["live"] == 2500);
  }
  std::sort(ms.begin(), ms.end());
  MESSAGE("cluster view at 2,500 agents: median " << ms[ms.size() / 2] << " ms, max " << ms.back()
                                                   << " ms to build and serialise, " << bytes
                                                   << " bytes");
  // Not a benchmark gate: only a guard against the view turning quadratic.
  CHECK(ms[ms.size() / 2] < 2000);
}

}  // namespace shoal::tracker
