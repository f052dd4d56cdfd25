// LayerPrep (snapshotter/layer_prep.h) on a real store and real extraction, with the layers
// served from an OCI layout on disk instead of the agent's pull path: the cases containerd
// cannot easily be made to send (a broken label, a refused media type, bad bytes, a stalled
// fetch, a full disk) and what each leaves behind. The real containerd drives it in
// snapshotter_test.cc.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "lib/core/sha256.h"
#include "snapshotter/layer_prep.h"
#include "snapshotter/store.h"
#include "tests/support/image.h"
#include "tests/support/layer_tar.h"
#include "tests/support/process.h"
#include "tests/support/small_disk.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {
namespace fs = std::filesystem;
using snapshotter::Deadline;
using snapshotter::Labels;

// Blobs of an OCI layout by digest; `replaced` serves other bytes for a digest; `delay` stalls
// the blobs in `slow` (bounded by the caller's deadline).
class LayoutSource : public snapshotter::LayerSource {
 public:
  explicit LayoutSource(std::string layout) : layout_(std::move(layout)) {}
  Result<ManifestBody> Manifest(const std::string&, const Digest& digest, Deadline) override {
    ++manifests;
    std::string path = layout_ + "/blobs/sha256/" + digest.hex();
    if (!fs::exists(path)) return MakeError(ErrorCode::kNotFound, "no manifest " + digest.str());
    return ManifestBody{ReadFile(path), ""};
  }
  Result<std::unique_ptr<extract::ByteSource>> OpenBlob(const std::string& ref,
                                                        const Digest& digest,
                                                        Deadline deadline) override {
    auto path = Blob(ref, digest, deadline);
    if (!path) return path.error();
    return extract::OpenFileSource(path.value());
  }
  Result<std::string> Blob(const std::string&, const Digest& digest, Deadline deadline) override {
    ++blobs;
    if (delay.count() > 0 && slow.count(digest.str())) {
      int now = ++in_flight;
      for (int seen = max_in_flight; now > seen && !max_in_flight.compare_exchange_weak(seen, now);) {
      }
      auto until = std::min(deadline, std::chrono::steady_clock::now() + delay);
      std::this_thread::sleep_until(until);
      --in_flight;
      if (until == deadline) return MakeError(ErrorCode::kUnavailable, "timed out");
    }
    auto it = replaced.find(digest.str());
    if (it != replaced.end()) return it->second;
    return layout_ + "/blobs/sha256/" + digest.hex();
  }
  std::map<std::string, std::string> replaced;
  std::set<std::string> slow;  // the blobs `delay` applies to
  std::chrono::milliseconds delay{0};
  std::atomic<int> manifests{0}, blobs{0};
  std::atomic<int> in_flight{0}, max_in_flight{0};  // slow blobs being served at once

 private:
  std::string layout_;
};

// The labels containerd's unpacker sends for layer i of `image` (CRI snapshot annotations on).
Labels UnpackLabels(const BuiltImage& image, size_t i, const std::vector<std::string>& chains) {
  std::string layers;
  for (size_t j = i; j < image.layer_digests.size(); ++j)
    layers += (layers.empty() ? "" : ",") + image.layer_digests[j].str();
  return Labels{{snapshotter::kTargetLabel, chains[i]},
                {snapshotter::kImageRefLabel, "gcr.io/proj/img:1"},
                {snapshotter::kManifestLabel, image.manifest_digest.str()},
                {snapshotter::kLayerLabel, image.layer_digests[i].str()},
                {snapshotter::kImageLayersLabel, layers}};
}

std::vector<std::string> Chains(const std::vector<Digest>& diff_ids) {
  std::vector<std::string> out;
  std::string chain;
  for (size_t i = 0; i < diff_ids.size(); ++i) {
    chain = i == 0 ? diff_ids[0].str() : Sha256::Of(chain + " " + diff_ids[i].str()).str();
    out.push_back(chain);
  }
  return out;
}

// Two layers: a file tree, then a whiteout of one file and an opaque directory.
Result<BuiltImage> TwoLayers(const std::string& layout) {
  std::vector<RawLayer> layers;
  layers.push_back(RawLayer{BuildTar({DirEntry("etc", 0755), FileEntry("etc/a", "alpha"),
                                      FileEntry("etc/b", "beta", 0600), DirEntry("var", 0711),
                                      FileEntry("var/x", "x")}),
                            Compression::kGzip});
  layers.push_back(RawLayer{BuildTar({FileEntry("etc/.wh.a", ""), DirEntry("var", 0711),
                                      FileEntry("var/.wh..wh..opq", ""),
                                      FileEntry("var/y", "y")}),
                            Compression::kZstd});
  return WriteOciImage(layout, "1", layers);
}

struct Setup {
  TempDir dir{"shoal-layer-prep"};
  std::unique_ptr<snapshotter::Store> store;
  std::unique_ptr<LayoutSource> source;
  BuiltImage image;
  std::vector<std::string> chains;

  Setup() {
    auto built = TwoLayers(dir.Sub("layout"));
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    image = built.value();
    chains = Chains(image.diff_ids);
    auto opened = snapshotter::Store::Open(dir.Sub("snap"));
    REQUIRE_MESSAGE(opened.has_value(), Why(opened));
    store = std::move(opened.value());
    source = std::make_unique<LayoutSource>(dir.Sub("layout"));
  }
  // Directories in staging (of one layer's blob, if given).
  size_t Staged(std::optional<Digest> blob = std::nullopt) const {
    size_t n = 0;
    for (auto it = fs::directory_iterator(dir.Sub("snap/staging")); it != fs::directory_iterator();
         ++it) {
      if (!it->is_directory()) continue;  // a kept layer's record
      if (!blob || it->path().filename().string().rfind(blob->hex().substr(0, 16), 0) == 0) ++n;
    }
    return n;
  }
};

}  // namespace

TEST_CASE("snapshotter layer prep: layers are extracted and verified and committed under "
          "their chain IDs in containerd's overlay format") {
  Setup s;
  snapshotter::LayerPrep prep(*s.store, *s.source);
  Labels l0 = UnpackLabels(s.image, 0, s.chains);
  auto out = prep.TryPrepare("default/1/extract-1 " + s.chains[0], "", l0);
  REQUIRE_MESSAGE(out.prepared, out.reason);
  // The committed snapshot: named by chain ID, the Prepare's labels, no active key left.
  auto info = s.store->Stat(s.chains[0]);
  REQUIRE(info.has_value());
  CHECK(info.value().kind == snapshotter::Kind::kCommitted);
  CHECK(info.value().parent.empty());
  CHECK(info.value().labels == l0);
  CHECK_FALSE(s.store->Stat("default/1/extract-1 " + s.chains[0]).has_value());
  // The second layer was started with the first (cri.image-layers) and is claimed now.
  Labels l1 = UnpackLabels(s.image, 1, s.chains);
  out = prep.TryPrepare("default/2/extract-2 " + s.chains[1], s.chains[0], l1);
  REQUIRE_MESSAGE(out.prepared, out.reason);
  CHECK(s.source->blobs == 3);  // the config and two layers, once each
  CHECK(s.Staged() == 0);
  CHECK(prep.stats().prepared == 2);
  CHECK(prep.stats().extracted == 2);

  // On disk: overlay's whiteout (char device 0/0) and opaque xattr, in the upper dir of the
  // layer, which a view mounts on the first one.
  auto mounts = s.store->View("v", s.chains[1], {});
  REQUIRE(mounts.has_value());
  std::string lower = mounts.value().at(0).options.back();  // lowerdir=top:bottom
  REQUIRE(lower.rfind("lowerdir=", 0) == 0);
  std::string top = lower.substr(9, lower.find(':') - 9);
  std::string bottom = lower.substr(lower.find(':') + 1);
  struct stat st;
  REQUIRE(::lstat((top + "/etc/a").c_str(), &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  CHECK(st.st_rdev == makedev(0, 0));
  char val[8] = {};
  CHECK(::lgetxattr((top + "/var").c_str(), "trusted.overlay.opaque", val, sizeof(val)) == 1);
  CHECK(val[0] == 'y');
  CHECK(ReadFile(bottom + "/etc/b") == "beta");
  REQUIRE(::lstat((bottom + "/etc/b").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  // The roots keep the store's upper dir mode (the tars have no "./" entry).
  REQUIRE(::stat(top.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0755);

  // Asked again (another namespace, or a later pull): found at once, nothing fetched.
  out = prep.TryPrepare("other/3/extract-3 " + s.chains[1], s.chains[0], l1);
  CHECK(out.prepared);
  CHECK(s.source->blobs == 3);
}

TEST_CASE("snapshotter layer prep: what it cannot do leaves the store as it was and says why") {
  Setup s;
  snapshotter::LayerPrepOptions opts;
  opts.timeout = std::chrono::milliseconds(1000);
  snapshotter::LayerPrep prep(*s.store, *s.source, opts);
  const std::string key = "default/1/extract-1 " + s.chains[0];
  Labels good = UnpackLabels(s.image, 0, s.chains);
  auto fallback = [&](const Labels& labels, const std::string& why) {
    auto out = prep.TryPrepare(key, "", labels);
    CHECK_FALSE(out.prepared);
    CHECK_MESSAGE(out.reason.find(why) != std::string::npos, out.reason);
    CHECK(s.store->List().empty());
  };

  SUBCASE("no CRI labels (snapshot annotations off)") {
    Labels l{{snapshotter::kTargetLabel, s.chains[0]}};
    fallback(l, "no label containerd.io/snapshot/cri.image-ref");
  }
  SUBCASE("a broken label") {
    Labels l = good;
    l[snapshotter::kLayerLabel] = "sha256:nothex";
    fallback(l, "label containerd.io/snapshot/cri.layer-digest");
  }
  SUBCASE("a layer digest that is not the target's layer") {
    Labels l = good;
    l[snapshotter::kLayerLabel] = s.image.layer_digests[1].str();
    fallback(l, "is not in manifest");
  }
  SUBCASE("a media type shoal does not extract") {
    std::string body = s.image.manifest_json;
    const std::string from = "application/vnd.oci.image.layer.v1.tar+gzip";
    REQUIRE(body.find(from) != std::string::npos);
    body.replace(body.find(from), from.size(), "application/vnd.oci.image.layer.v1.tar+gzip+encrypted");
    Digest d = Sha256::Of(body);
    WriteFile(s.dir.Sub("layout/blobs/sha256/" + d.hex()), body);
    Labels l = good;
    l[snapshotter::kManifestLabel] = d.str();
    fallback(l, "which shoal does not extract");
  }
  SUBCASE("bytes that do not match the layer digest") {
    std::string bad = s.dir.Sub("bad-layer");
    std::string bytes = ReadFile(s.dir.Sub("layout/blobs/sha256/" + s.image.layer_digests[0].hex()));
    bytes[bytes.size() / 2] ^= 0x55;
    WriteFile(bad, bytes);
    s.source->replaced[s.image.layer_digests[0].str()] = bad;
    fallback(good, "extract layer " + s.image.layer_digests[0].str());
    // Nothing of the bad layer is left in staging (layer 1, started beside it, may be there).
    CHECK(s.Staged(s.image.layer_digests[0]) == 0);
  }
  SUBCASE("a layer whose tar is not the config's diff ID") {
    // Another layer's bytes under this digest would fail the digest; a config whose diff ID
    // is wrong is what this catches: the image's config is swapped for one with layer 1's.
    std::string config = ReadFile(s.dir.Sub("layout/blobs/sha256/" + s.image.config_digest.hex()));
    std::string d0 = s.image.diff_ids[0].str(), d1 = s.image.diff_ids[1].str();
    config.replace(config.find(d0), d0.size(), d1);
    std::string cpath = s.dir.Sub("config");
    WriteFile(cpath, config);
    s.source->replaced[s.image.config_digest.str()] = cpath;
    Labels l = good;
    std::string chain = d1;
    l[snapshotter::kTargetLabel] = chain;
    auto out = prep.TryPrepare("default/1/extract-1 " + chain, "", l);
    CHECK_FALSE(out.prepared);
    CHECK_MESSAGE(out.reason.find("expected diff ID " + d1) != std::string::npos, out.reason);
    CHECK(s.store->List().empty());
  }
  SUBCASE("a fetch that does not end within the timeout") {
    s.source->delay = std::chrono::milliseconds(3000);
    s.source->slow.insert(s.image.layer_digests[0].str());
    auto t0 = std::chrono::steady_clock::now();
    fallback(good, "not extracted within 1000 ms");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2500));
  }
  CHECK(prep.stats().fallbacks == 1);
  CHECK(prep.stats().prepared == 0);
}

TEST_CASE("snapshotter layer prep: an image whose manifest cannot be had falls back for each "
          "layer at once after the first") {
  Setup s;
  snapshotter::LayerPrep prep(*s.store, *s.source);
  Labels l0 = UnpackLabels(s.image, 0, s.chains);
  Labels l1 = UnpackLabels(s.image, 1, s.chains);
  const std::string missing = Sha256::Of(std::string("no such manifest")).str();
  l0[snapshotter::kManifestLabel] = l1[snapshotter::kManifestLabel] = missing;
  auto out = prep.TryPrepare("default/1/extract-1 " + s.chains[0], "", l0);
  CHECK_FALSE(out.prepared);
  CHECK_MESSAGE(out.reason.find("no manifest " + missing) != std::string::npos, out.reason);
  out = prep.TryPrepare("default/2/extract-2 " + s.chains[1], s.chains[0], l1);
  CHECK_FALSE(out.prepared);
  CHECK(s.source->manifests == 1);  // remembered, not asked again
  CHECK(prep.stats().fallbacks == 2);
  CHECK(s.store->List().empty());
}

TEST_CASE("snapshotter layer prep: the image's later layers are fetched and extracted beside "
          "the first one") {
  Setup s;
  snapshotter::LayerPrep prep(*s.store, *s.source);
  s.source->delay = std::chrono::milliseconds(800);
  for (const Digest& d : s.image.layer_digests) s.source->slow.insert(d.str());
  auto t0 = std::chrono::steady_clock::now();
  auto out = prep.TryPrepare("default/1/extract-1 " + s.chains[0], "", UnpackLabels(s.image, 0, s.chains));
  REQUIRE_MESSAGE(out.prepared, out.reason);
  out = prep.TryPrepare("default/2/extract-2 " + s.chains[1], s.chains[0],
                        UnpackLabels(s.image, 1, s.chains));
  REQUIRE_MESSAGE(out.prepared, out.reason);
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(s.source->max_in_flight == 2);
  CHECK(took < std::chrono::milliseconds(1500));  // one delay, not two
}

TEST_CASE("snapshotter layer prep: a Prepare waiting when the agent stops falls back at once") {
  Setup s;
  snapshotter::LayerPrepOptions opts;
  opts.timeout = std::chrono::seconds(60);
  snapshotter::LayerPrep prep(*s.store, *s.source, opts);
  s.source->delay = std::chrono::milliseconds(2000);
  s.source->slow.insert(s.image.layer_digests[0].str());
  snapshotter::PrepareOutcome out;
  std::chrono::steady_clock::time_point returned;
  std::thread prepare([&] {
    out = prep.TryPrepare("default/1/extract-1 " + s.chains[0], "", UnpackLabels(s.image, 0, s.chains));
    returned = std::chrono::steady_clock::now();
  });
  REQUIRE(WaitUntil([&] { return s.source->in_flight == 1; }, std::chrono::seconds(10),
                    std::chrono::milliseconds(10)));
  auto stopping = std::chrono::steady_clock::now();
  prep.Stop();  // returns once the worker's fetch has ended
  prepare.join();
  CHECK_FALSE(out.prepared);
  CHECK(out.reason == "the agent is stopping");
  CHECK(returned - stopping < std::chrono::milliseconds(500));
  CHECK(s.store->List().empty());
  CHECK(s.Staged() == 0);  // what the worker extracted after all was nobody's: deleted
}

// What a Stage reported, for a test to wait on.
struct StageWatch {
  std::mutex mu;
  std::vector<snapshotter::StageProgress> seen;
  std::function<void(const snapshotter::StageProgress&)> Callback() {
    return [this](const snapshotter::StageProgress& p) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(p);
    };
  }
  std::optional<snapshotter::StageProgress> Final() {
    std::lock_guard<std::mutex> lock(mu);
    if (seen.empty() || !seen.back().done) return std::nullopt;
    return seen.back();
  }
  snapshotter::StageProgress Wait() {
    REQUIRE(WaitUntil([&] { return Final().has_value(); }, std::chrono::seconds(20),
                      std::chrono::milliseconds(10)));
    return *Final();
  }
};

TEST_CASE(
    "snapshotter layer prep: a Stage extracts every layer ahead of containerd, whose "
    "Prepares then only move them into place") {
  Setup s;
  snapshotter::LayerPrepOptions opts;
  // Called on the worker threads, unordered with the Stage's progress: another worker may
  // report the Stage done before this layer's worker has called it.
  std::atomic<int> staged_calls{0};
  opts.on_staged = [&staged_calls] { ++staged_calls; };
  snapshotter::LayerPrep prep(*s.store, *s.source, opts);
  StageWatch watch;
  prep.Stage("gcr.io/proj/img:1", s.image.manifest_digest, std::chrono::hours(1), watch.Callback());
  snapshotter::StageProgress p = watch.Wait();
  CHECK(p.layers == 2);
  CHECK(p.prepared == 2);
  CHECK(p.failed == 0);
  CHECK(p.error.empty());
  CHECK(prep.stats().extracted == 2);
  CHECK(WaitUntil([&] { return staged_calls.load() == 2; }, std::chrono::seconds(5),
                  std::chrono::milliseconds(5)));
  CHECK(staged_calls.load() == 2);
  CHECK(s.Staged() == 2);
  const uint64_t staged = prep.StagedBytes();
  CHECK(staged > 0);
  CHECK(s.store->List().empty());  // nothing is containerd's yet
  const int fetched = s.source->blobs;

  // containerd's Prepares claim them: nothing fetched or extracted again.
  for (size_t i = 0; i < 2; ++i) {
    auto out = prep.TryPrepare("default/" + std::to_string(i) + "/extract " + s.chains[i],
                               i == 0 ? "" : s.chains[0], UnpackLabels(s.image, i, s.chains));
    REQUIRE_MESSAGE(out.prepared, out.reason);
  }
  CHECK(s.source->blobs == fetched);
  CHECK(prep.stats().extracted == 2);
  CHECK(prep.stats().prepared == 2);
  CHECK(prep.StagedBytes() == 0);
  CHECK(s.Staged() == 0);
  CHECK(fs::is_empty(s.dir.Sub("snap/staging")));  // the records went with the layers
  CHECK(s.store->CommittedBytes() >= staged);

  // Staged again when every layer is a snapshot already: done at once, nothing extracted.
  StageWatch again;
  prep.Stage("gcr.io/proj/img:1", s.image.manifest_digest, std::chrono::hours(1), again.Callback());
  p = again.Wait();
  CHECK(p.prepared == 2);
  CHECK(prep.stats().extracted == 2);
}

TEST_CASE(
    "snapshotter layer prep: staged layers survive an agent restart on the same boot, "
    "not a reboot") {
  Setup s;
  {
    snapshotter::LayerPrep prep(*s.store, *s.source);
    StageWatch watch;
    prep.Stage("gcr.io/proj/img:1", s.image.manifest_digest, std::chrono::hours(1),
               watch.Callback());
    CHECK(watch.Wait().prepared == 2);
  }  // the agent stops
  CHECK(s.Staged() == 2);
  uint64_t staged = 0;
  {
    snapshotter::LayerPrep prep(*s.store, *s.source);
    CHECK(prep.stats().restored == 2);
    staged = prep.StagedBytes();
    CHECK(staged > 0);
    auto out =
        prep.TryPrepare("default/1/extract " + s.chains[0], "", UnpackLabels(s.image, 0, s.chains));
    REQUIRE_MESSAGE(out.prepared, out.reason);
    CHECK(prep.stats().extracted == 0);  // moved into place, not extracted again
    CHECK(ReadFile(s.dir.Sub("snap") + "/snapshots/1/fs/etc/b") == "beta");
    CHECK(prep.StagedBytes() < staged);
  }
  CHECK(s.Staged() == 1);  // the second layer is still kept
  {
    // A reboot: files that were never fsynced may be cut; the kept layer is deleted.
    snapshotter::LayerPrepOptions opts;
    opts.boot_id = "another-boot";
    snapshotter::LayerPrep prep(*s.store, *s.source, opts);
    CHECK(prep.stats().restored == 0);
    CHECK(prep.StagedBytes() == 0);
    CHECK(fs::is_empty(s.dir.Sub("snap/staging")));
  }
}

TEST_CASE(
    "snapshotter layer prep: a Stage of an image it cannot read ends at once with the "
    "reason") {
  Setup s;
  snapshotter::LayerPrep prep(*s.store, *s.source);
  StageWatch watch;
  const Digest missing = Sha256::Of(std::string("no such manifest"));
  prep.Stage("gcr.io/proj/img:1", missing, std::chrono::hours(1), watch.Callback());
  snapshotter::StageProgress p = watch.Wait();
  CHECK(p.layers == 0);
  CHECK_MESSAGE(p.error.find("no manifest " + missing.str()) != std::string::npos, p.error);
  CHECK(prep.stats().extracted == 0);
  // A layer whose bytes are bad fails the Stage with the extraction's reason; the other is kept.
  s.source->replaced[s.image.layer_digests[1].str()] =
      s.dir.Sub("layout") + "/blobs/sha256/" + s.image.layer_digests[0].hex();
  StageWatch bad;
  prep.Stage("gcr.io/proj/img:1", s.image.manifest_digest, std::chrono::hours(1), bad.Callback());
  p = bad.Wait();
  CHECK(p.layers == 2);
  CHECK(p.prepared == 1);
  CHECK(p.failed == 1);
  CHECK_MESSAGE(p.error.find(s.image.layer_digests[1].str()) != std::string::npos, p.error);
  CHECK(s.Staged() == 1);
}

TEST_CASE(
    "snapshotter layer prep: a Stage on a full disk reports the layer that does not fit with "
    "the extraction's ENOSPC, leaves nothing of it, prepares the layers that fit, and a later "
    "Prepare of it falls back") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    return;
  }
  TempDir dir("shoal-layer-prep-full");
  // The snapshotter root on a 4 MiB disk. Layer 1 (8 MiB of files) cannot fit; layer 2 (2.5 MiB)
  // fits only once what layer 1 wrote before the disk filled up is gone again.
  SmallDisk disk(dir, "snap", 4);
  REQUIRE(disk.mounted());
  std::vector<RawLayer> layers;
  layers.push_back(RawLayer{BuildTar({FileEntry("a", std::string(512u << 10, 'a'))})});
  layers.push_back(RawLayer{BuildTar({FileEntry("big", std::string(8u << 20, 'b'))})});
  layers.push_back(RawLayer{BuildTar({FileEntry("c", std::string(2560u << 10, 'c'))})});
  auto built = WriteOciImage(dir.Sub("layout"), "1", layers);
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  const BuiltImage& image = built.value();
  const std::vector<std::string> chains = Chains(image.diff_ids);
  auto opened = snapshotter::Store::Open(disk.path());
  REQUIRE_MESSAGE(opened.has_value(), Why(opened));
  snapshotter::Store& store = *opened.value();
  LayoutSource source(dir.Sub("layout"));
  snapshotter::LayerPrepOptions opts;
  opts.workers = 1;  // one layer at a time, in order: layer 2 starts after layer 1 failed
  snapshotter::LayerPrep prep(store, source, opts);
  const uint64_t staged_before = prep.StagedBytes();

  StageWatch watch;
  prep.Stage("gcr.io/proj/img:1", image.manifest_digest, std::chrono::hours(1), watch.Callback());
  snapshotter::StageProgress p = watch.Wait();
  CHECK(p.layers == 3);
  CHECK(p.prepared == 2);
  CHECK(p.failed == 1);
  CHECK_MESSAGE(
      p.error.find("extract layer " + image.layer_digests[1].str() + ": ") != std::string::npos,
      p.error);
  CHECK_MESSAGE(p.error.find("No space left on device") != std::string::npos, p.error);

  // In staging: the two layers that fit and their records; nothing of layer 1 (no directory,
  // partial or not, and no record).
  const std::string staging = disk.path() + "/staging";
  auto layer_of = [&](const std::string& name) -> int {
    for (size_t i = 0; i < image.layer_digests.size(); ++i) {
      if (name.rfind(image.layer_digests[i].hex().substr(0, 16), 0) == 0)
        return static_cast<int>(i);
    }
    return -1;
  };
  std::map<int, std::string> dirs;
  std::set<int> records;
  std::string others;
  for (const auto& e : fs::directory_iterator(staging)) {
    const std::string name = e.path().filename().string();
    const int layer = layer_of(name);
    if (e.is_directory() && name.find(".partial") == std::string::npos && layer >= 0) {
      dirs[layer] = e.path().string();
    } else if (name.ends_with(".json") && layer >= 0) {
      records.insert(layer);
    } else {
      others += name + "\n";
    }
  }
  CHECK(dirs.size() == 2);
  CHECK(dirs.count(0) == 1);
  CHECK(dirs.count(2) == 1);
  CHECK(records == std::set<int>{0, 2});
  CHECK_MESSAGE(others.empty(), others);  // e.g. a partial directory of layer 1
  REQUIRE(dirs.count(2) == 1);
  CHECK(ReadFile(dirs[2] + "/c") == std::string(2560u << 10, 'c'));
  // StagedBytes counts what those two use on disk, and nothing for the failed layer.
  uint64_t kept = 0;
  for (const auto& entry : dirs) {
    auto usage = snapshotter::DiskUsage(entry.second);
    REQUIRE(usage.has_value());
    kept += static_cast<uint64_t>(usage.value().size);
  }
  CHECK(prep.StagedBytes() == staged_before + kept);

  // containerd's Prepares: layer 0 is moved into place; layer 1 falls back with the reason
  // (containerd then unpacks it itself) and leaves the store as it was.
  auto out =
      prep.TryPrepare("default/1/extract-1 " + chains[0], "", UnpackLabels(image, 0, chains));
  REQUIRE_MESSAGE(out.prepared, out.reason);
  out = prep.TryPrepare("default/2/extract-2 " + chains[1], chains[0],
                        UnpackLabels(image, 1, chains));
  CHECK_FALSE(out.prepared);
  CHECK_MESSAGE(out.reason.find("No space left on device") != std::string::npos, out.reason);
  CHECK_FALSE(store.Stat(chains[1]).has_value());
  CHECK(store.List().size() == 1);
  CHECK(prep.stats().extracted == 2);
}

}  // namespace shoal::testkit
