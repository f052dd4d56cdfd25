// The agent's containerd snapshotter driven by the real containerd (Debian's 1.6) and its `ctr`:
// containerd reaches it as a proxy plugin over the agent's unix socket, exactly as a node would
// be configured. The tests mount what the snapshotter answers with mount(2) (overlay works as
// root here; see shared/reference/runtimes.md) and unmount it again.
#include <doctest/doctest.h>

#include <sys/mount.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "lib/core/sha256.h"

#include "tests/support/agent.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/cri.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/layer_tar.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {
namespace fs = std::filesystem;

// A mount as `ctr snapshots mounts TARGET KEY` prints it: "mount -t TYPE SOURCE TARGET -o OPTS".
struct PrintedMount {
  std::string type, source, target;
  std::vector<std::string> options;

  bool Has(const std::string& option) const {
    for (const auto& o : options)
      if (o == option) return true;
    return false;
  }
  // The value of an option "name=value"; "" when absent.
  std::string Value(const std::string& name) const {
    for (const auto& o : options)
      if (o.rfind(name + "=", 0) == 0) return o.substr(name.size() + 1);
    return "";
  }
};

PrintedMount ParseMount(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  INFO("ctr snapshots mounts printed: ", text);
  REQUIRE(words.size() == 7);
  REQUIRE(words[0] == "mount");
  REQUIRE(words[1] == "-t");
  REQUIRE(words[5] == "-o");
  PrintedMount m{words[2], words[3], words[4], {}};
  std::istringstream opts(words[6]);
  for (std::string o; std::getline(opts, o, ',');) m.options.push_back(o);
  return m;
}

// Mounts a PrintedMount at `target` with mount(2) and unmounts it when destroyed.
class ScopedMount {
 public:
  ScopedMount(const PrintedMount& m, const std::string& target) : target_(target) {
    fs::create_directories(target);
    int rc;
    if (m.type == "bind") {
      rc = ::mount(m.source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr);
      if (rc == 0 && m.Has("ro")) {
        rc = ::mount(nullptr, target.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr);
      }
    } else {
      std::string data;
      for (const auto& o : m.options) data += (data.empty() ? "" : ",") + o;
      rc = ::mount(m.source.c_str(), target.c_str(), m.type.c_str(), 0, data.c_str());
    }
    int err = errno;
    mounted_ = rc == 0;
    REQUIRE_MESSAGE(mounted_, ("mount -t " + m.type + " " + m.source + " " + target + ": " +
                               std::strerror(err)));
  }
  ~ScopedMount() {
    if (mounted_) ::umount2(target_.c_str(), MNT_DETACH);
  }
  ScopedMount(const ScopedMount&) = delete;
  ScopedMount& operator=(const ScopedMount&) = delete;

 private:
  std::string target_;
  bool mounted_ = false;
};

// Mount points under `dir` still in this process's mount table.
std::vector<std::string> MountsUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::istringstream in(ReadFile("/proc/self/mounts"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string dev, point;
    fields >> dev >> point;
    if (point.rfind(dir, 0) == 0) out.push_back(point);
  }
  return out;
}

// How many entries `dir` has (0 when it is missing).
size_t Entries(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

// Rows of a ctr table (the header dropped), split at whitespace.
std::vector<std::vector<std::string>> Rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> row;
    for (std::string f; fields >> f;) row.push_back(f);
    if (!row.empty()) rows.push_back(std::move(row));
  }
  return rows;
}

// containerd's chain ID of the top layer: chain(1) = diff(1), chain(n) = sha256(chain(n-1) +
// " " + diff(n)). Snapshots of unpacked layers are named by it.
std::string ChainId(const std::vector<Digest>& diff_ids) {
  std::string chain = diff_ids.at(0).str();
  for (size_t i = 1; i < diff_ids.size(); ++i) chain = Sha256::Of(chain + " " + diff_ids[i].str()).str();
  return chain;
}

// An agent serving the snapshotter on a socket in the test's temp dir (upstreams optional), and
// a containerd that has it as proxy plugin "shoal". Members are destroyed bottom up: mounts
// made by a test go before containerd, containerd before the agent, the dir last.
struct World {
  TempDir dir{"shoal-snap"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<Agent> agent;
  std::unique_ptr<Containerd> containerd;

  std::string hosts_dir;  // with cri: hosts.toml for gcr.io, pointing at the agent's shim

  // cri: containerd's CRI plugin runs with snapshotter "shoal", snapshot annotations on and
  // gcr.io mirrored to the agent (needs with_upstream). agent_args go to the agent.
  explicit World(bool with_upstream, bool cri = false,
                 const std::vector<std::string>& agent_args = {}) {
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.extra_args = {"--snapshotter-socket", Socket(), "--log-level", "debug"};
    opts.extra_args.insert(opts.extra_args.end(), agent_args.begin(), agent_args.end());
    if (with_upstream) {
      auto up = CountedUpstream::Start();
      REQUIRE_MESSAGE(up.has_value(), Why(up));
      registry = std::move(up.value().registry);
      proxy = std::move(up.value().proxy);
      opts.upstreams = {"gcr.io=" + proxy->Url()};
      opts.extra_args.insert(opts.extra_args.end(), {"--unmapped", "error"});
    }
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agent = std::move(a.value());
    std::string extra = Containerd::ProxySnapshotterConfig("shoal", Socket());
    if (cri) {
      hosts_dir = dir.Sub("certs.d");
      auto generated = Shoalctl({"config", "containerd", "--agent", agent->HostPort(),
                                 "--registry", "gcr.io", "-o", hosts_dir});
      REQUIRE_MESSAGE(generated.has_value(), Why(generated));
      extra += Containerd::CriImageConfig("shoal", hosts_dir);
    }
    auto c = Containerd::Start(extra, cri);
    REQUIRE_MESSAGE(c.has_value(), Why(c));
    containerd = std::move(c.value());
  }

  std::string Socket() const { return dir.Sub("snapshotter.sock"); }
  // The snapshotter's directories, under the agent's cache dir by default.
  std::string SnapshotsDir() const { return dir.Sub("cache/snapshotter/snapshots"); }

  // `ctr snapshots --snapshotter shoal <args>`; REQUIREs success and returns the output.
  std::string Snap(std::vector<std::string> args, const std::string& snapshotter = "shoal") {
    args.insert(args.begin(), {"snapshots", "--snapshotter", snapshotter});
    auto out = containerd->Ctr(args, std::chrono::seconds(60));
    REQUIRE_MESSAGE(out.has_value(), (Why(out) + "\nagent:\n" + agent->LogTail() +
                                      "\ncontainerd:\n" + containerd->LogTail()));
    return out.value();
  }
  // The same, for a call that must fail; returns the error message.
  std::string SnapFails(std::vector<std::string> args) {
    args.insert(args.begin(), {"snapshots", "--snapshotter", "shoal"});
    auto out = containerd->Ctr(args, std::chrono::seconds(60));
    REQUIRE_MESSAGE(!out.has_value(), ("ctr succeeded: " + out.value()));
    return out.error().message;
  }
  PrintedMount Mounts(const std::string& key, const std::string& snapshotter = "shoal") {
    return ParseMount(Snap({"mounts", dir.Sub("target"), key}, snapshotter));
  }
  // After an agent restart: containerd's gRPC connection to the old socket reconnects with
  // backoff, and calls fail fast meanwhile (a kubelet retries its PullImage). Waits until a
  // Prepare reaches the agent again (a list of an empty namespace would not), then removes it.
  void WaitUntilContainerdReconnects() {
    REQUIRE_MESSAGE(WaitUntil(
                        [&] {
                          return containerd
                              ->Ctr({"-n", "probe", "snapshots", "--snapshotter", "shoal",
                                     "prepare", "probe"},
                                    std::chrono::seconds(10))
                              .has_value();
                        },
                        std::chrono::seconds(30), std::chrono::milliseconds(250)),
                    (agent->LogTail() + "\n" + containerd->LogTail()));
    Ctr({"-n", "probe", "snapshots", "--snapshotter", "shoal", "rm", "probe"});
  }
  // `ctr <args>`; REQUIREs success and returns the output.
  std::string Ctr(std::vector<std::string> args) {
    auto out = containerd->Ctr(args, std::chrono::seconds(60));
    REQUIRE_MESSAGE(out.has_value(), (Why(out) + "\nagent:\n" + agent->LogTail() +
                                      "\ncontainerd:\n" + containerd->LogTail()));
    return out.value();
  }
};

// Checks that two trees are the same, file for file (tests/support/layer_tar.h's DiffTrees):
// types, modes, owners, contents, links, devices, xattrs, hard links and the mtimes of all but
// directories.
void CheckSameFiles(const Tree& ta, const Tree& tb) {
  CHECK(ta.size() > 10);
  CHECK(ta.size() == tb.size());
  std::vector<std::string> diffs = DiffTrees(ta, tb, /*compare_dir_mtimes=*/false);
  std::string shown;
  for (const auto& d : diffs) shown += d + "\n";
  CHECK_MESSAGE(diffs.empty(), shown);
}

// CheckSameFiles for the trees mounted at a and b, and the roots' modes and owners (the
// whiteouts hidden by overlayfs).
void CheckSameTree(const std::string& a, const std::string& b) {
  CheckSameFiles(SnapshotTree(a), SnapshotTree(b));
  struct stat sa, sb;
  REQUIRE(::stat(a.c_str(), &sa) == 0);
  REQUIRE(::stat(b.c_str(), &sb) == 0);
  CHECK((sa.st_mode & 07777) == (sb.st_mode & 07777));
  CHECK(sa.st_uid == sb.st_uid);
  CHECK(sa.st_gid == sb.st_gid);
}

// containerd's chain IDs of every layer, bottom first.
std::vector<std::string> ChainIds(const std::vector<Digest>& diff_ids) {
  std::vector<std::string> out;
  for (size_t i = 1; i <= diff_ids.size(); ++i) {
    out.push_back(ChainId(std::vector<Digest>(diff_ids.begin(), diff_ids.begin() + i)));
  }
  return out;
}

// Views `top_chain` in shoal's snapshotter (the CRI's namespace k8s.io) and in the native one
// (ctr's default namespace, where ref was pulled with --snapshotter native), mounts both and
// compares them; removes the views again.
void CheckSameAsNative(World& w, const std::string& top_chain) {
  // Views no lease holds are garbage to containerd: the collection that the end of a pull
  // schedules (its lease goes) removed them while they were compared. Let it pass, and make
  // the views GC roots.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter", "shoal", "view", "shoal-view", top_chain});
  w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter", "shoal", "label", "shoal-view",
         "containerd.io/gc.root=test"});
  w.Snap({"view", "native-view", top_chain}, "native");
  w.Snap({"label", "native-view", "containerd.io/gc.root=test"}, "native");
  PrintedMount shoal_mount = ParseMount(w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter",
                                               "shoal", "mounts", w.dir.Sub("target"),
                                               "shoal-view"}));
  CHECK(shoal_mount.type == "overlay");
  PrintedMount native_mount = w.Mounts("native-view", "native");
  {
    ScopedMount a(shoal_mount, w.dir.Sub("mnt-shoal"));
    ScopedMount b(native_mount, w.dir.Sub("mnt-native"));
    CheckSameTree(w.dir.Sub("mnt-shoal"), w.dir.Sub("mnt-native"));
  }
  w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter", "shoal", "rm", "shoal-view"});
  w.Snap({"rm", "native-view"}, "native");
}

// Blob body bytes the agent's shim sent to its clients (containerd).
double ShimBlobBytes(const Agent& agent) { return agent.Metric("shoal_shim_blob_bytes_total"); }

}  // namespace

TEST_CASE("snapshotter: ctr prepares, commits, views, lists, measures and removes on the agent") {
  World w(false);
  const std::string snaps = w.SnapshotsDir();

  // A base layer: a writable bind mount of a fresh directory on the agent's disk.
  w.Snap({"prepare", "base-key"});
  PrintedMount base = w.Mounts("base-key");
  CHECK(base.type == "bind");
  CHECK(base.Has("rw"));
  CHECK(base.Has("rbind"));
  CHECK(base.source.rfind(snaps + "/", 0) == 0);
  CHECK(fs::path(base.source).filename() == "fs");
  WriteFile(base.source + "/one", std::string(200000, '1'));
  w.Snap({"commit", "layer1", "base-key"});

  // A second layer on top: an overlay whose lower dir is the first layer. Written through a
  // real overlay mount, as containerd's unpacker does.
  w.Snap({"prepare", "child-key", "layer1"});
  PrintedMount child = w.Mounts("child-key");
  CHECK(child.type == "overlay");
  CHECK(child.Value("lowerdir") == base.source);
  CHECK(child.Value("upperdir").rfind(snaps + "/", 0) == 0);
  CHECK(child.Value("workdir").rfind(snaps + "/", 0) == 0);
  {
    ScopedMount m(child, w.dir.Sub("mnt-child"));
    CHECK(ReadFile(w.dir.Sub("mnt-child/one")).size() == 200000);
    WriteFile(w.dir.Sub("mnt-child/two"), "second layer");
  }
  CHECK(ReadFile(child.Value("upperdir") + "/two") == "second layer");
  CHECK_FALSE(fs::exists(child.Value("upperdir") + "/one"));
  w.Snap({"commit", "layer2", "child-key"});

  // A read-only view of both layers: an overlay of two lower dirs, nearest first.
  w.Snap({"view", "view-key", "layer2"});
  PrintedMount view = w.Mounts("view-key");
  CHECK(view.type == "overlay");
  CHECK(view.Value("lowerdir") == child.Value("upperdir") + ":" + base.source);
  CHECK(view.Value("upperdir").empty());
  {
    ScopedMount m(view, w.dir.Sub("mnt-view"));
    CHECK(ReadFile(w.dir.Sub("mnt-view/two")) == "second layer");
    CHECK(ReadFile(w.dir.Sub("mnt-view/one")).size() == 200000);
  }
  // A view of one layer is a read-only bind of it.
  w.Snap({"view", "view1-key", "layer1"});
  PrintedMount view1 = w.Mounts("view1-key");
  CHECK(view1.type == "bind");
  CHECK(view1.source == base.source);
  CHECK(view1.Has("ro"));

  // ctr lists what the agent holds, kinds and parents included.
  std::map<std::string, std::vector<std::string>> listed;
  for (auto& row : Rows(w.Snap({"ls"}))) listed[row[0]] = row;
  CHECK(listed.size() == 4);
  CHECK(listed["layer1"] == std::vector<std::string>{"layer1", "Committed"});
  CHECK(listed["layer2"] == std::vector<std::string>{"layer2", "layer1", "Committed"});
  CHECK(listed["view-key"] == std::vector<std::string>{"view-key", "layer2", "View"});
  // Usage: the first layer holds its 200 kB file.
  auto usage = Rows(w.Snap({"usage", "layer1"}));
  REQUIRE(usage.size() == 1);
  CHECK(usage[0][0] == "layer1");
  CHECK(usage[0][2] == "KiB");  // "196 KiB" or so: at least the file's blocks
  CHECK(std::stod(usage[0][1]) >= 195.0);
  // Labels under containerd.io/snapshot/ are the ones containerd hands to its snapshotter
  // (it keeps the others itself): Update stores them on the agent, Stat gives them back.
  const std::string label = "containerd.io/snapshot/shoal-test";
  w.Snap({"label", "layer1", label + "=owner"});
  CHECK(w.Snap({"info", "layer1"}).find("\"" + label + "\": \"owner\"") != std::string::npos);
  CHECK(ReadFile(w.dir.Sub("cache/snapshotter/metadata.json")).find(label) != std::string::npos);

  // A layer with children cannot go; containerd names the reason.
  CHECK(w.SnapFails({"rm", "layer1"}).find("failed precondition") != std::string::npos);
  // Removing the leaves and then the layer frees their directories on the agent's disk.
  // containerd drops them from its own metadata at once and removes them from the snapshotter
  // in its next garbage collection, which the removal schedules.
  w.Snap({"rm", "view-key", "view1-key"});
  w.Snap({"rm", "layer2"});
  CHECK_MESSAGE(WaitUntil([&] { return Entries(snaps) == 1; }, std::chrono::seconds(30),
                          std::chrono::milliseconds(100)),
                w.containerd->LogTail());
  CHECK_FALSE(fs::exists(child.Value("upperdir")));
  CHECK(fs::exists(base.source + "/one"));

  // The agent restarts (SIGTERM: the socket goes, then comes back): committed snapshots and
  // active ones are still there, and containerd's connection finds the new socket.
  w.Snap({"prepare", "pending-key", "layer1"});
  REQUIRE(w.agent->Stop() == 0);
  CHECK_FALSE(fs::exists(w.Socket()));
  REQUIRE(w.agent->Restart().has_value());
  std::string info;
  bool back = WaitUntil(
      [&] {
        auto out = w.containerd->Ctr({"snapshots", "--snapshotter", "shoal", "info", "layer1"},
                                     std::chrono::seconds(10));
        if (out) info = out.value();
        return out.has_value();
      },
      std::chrono::seconds(30), std::chrono::milliseconds(200));
  REQUIRE_MESSAGE(back, (w.agent->LogTail() + "\n" + w.containerd->LogTail()));
  CHECK(info.find("\"Kind\": \"Committed\"") != std::string::npos);
  CHECK(info.find(label) != std::string::npos);
  PrintedMount pending = w.Mounts("pending-key");
  CHECK(pending.Value("lowerdir") == base.source);
  CHECK(Rows(w.Snap({"ls"})).size() == 2);
  CHECK(w.agent->Log().find("containerd snapshotter on unix:" + w.Socket() + ", 2 snapshots") !=
        std::string::npos);

  // Everything removed: nothing left on the agent's disk.
  w.Snap({"rm", "pending-key"});
  w.Snap({"rm", "layer1"});
  CHECK(Rows(w.Snap({"ls"})).empty());
  CHECK(WaitUntil([&] { return Entries(snaps) == 0; }, std::chrono::seconds(30),
                  std::chrono::milliseconds(100)));
  CHECK(ReadFile(w.dir.Sub("cache/snapshotter/metadata.json")).find("\"snapshots\":[]") !=
        std::string::npos);
  CHECK(MountsUnder(w.dir.path()).empty());
}

TEST_CASE("snapshotter: an image pulled through the agent unpacks into shoal snapshots that "
          "mount to the native snapshotter's tree") {
  World w(true);
  // Two layers: files, a symlink and a hard link, then a whiteout and an opaque directory.
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 12, {1ull << 20}, 1801});
  LayerSpec top{Compression::kGzip, 6, {}, 1802};
  top.with_whiteout = true;
  spec.layers.push_back(top);
  const std::string layout = w.dir.Sub("layout");
  auto built = BuildImage(spec, layout, "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  auto pushed = PushImage(*w.registry, layout, "1", "proj/img");
  REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
  const std::string hosts_dir = w.dir.Sub("certs.d");
  auto generated = Shoalctl({"config", "containerd", "--agent", w.agent->HostPort(), "--registry",
                             "gcr.io", "-o", hosts_dir});
  REQUIRE_MESSAGE(generated.has_value(), Why(generated));

  // containerd fetches through the agent's shim and unpacks into the agent's snapshotter.
  auto pulled = w.containerd->Pull(hosts_dir, "gcr.io/proj/img:1", "shoal");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail() +
                                       "\n" + w.containerd->LogTail()));
  CHECK(w.proxy->BlobBytes() == built.value().total_blob_bytes);
  // The same image unpacked by containerd's native snapshotter: the reference tree.
  auto native = w.containerd->Pull(hosts_dir, "gcr.io/proj/img:1", "native");
  REQUIRE_MESSAGE(native.has_value(), Why(native));

  // One committed snapshot per layer, named by chain ID, the top one on the bottom one.
  const std::string bottom = built.value().diff_ids.at(0).str();
  const std::string top_chain = ChainId(built.value().diff_ids);
  std::map<std::string, std::vector<std::string>> listed;
  for (auto& row : Rows(w.Snap({"ls"}))) listed[row[0]] = row;
  REQUIRE(listed.size() == 2);
  CHECK(listed[bottom] == std::vector<std::string>{bottom, "Committed"});
  CHECK(listed[top_chain] == std::vector<std::string>{top_chain, bottom, "Committed"});

  // Views of the top layer in both snapshotters, mounted: the same tree, file for file (modes,
  // owners, contents, links, xattrs; the whiteouts hidden by overlayfs).
  // Unleased views are garbage to containerd (see CheckSameAsNative): GC roots, made after the
  // collection the pull's end schedules.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  w.Snap({"view", "shoal-view", top_chain});
  w.Snap({"label", "shoal-view", "containerd.io/gc.root=test"});
  w.Snap({"view", "native-view", top_chain}, "native");
  w.Snap({"label", "native-view", "containerd.io/gc.root=test"}, "native");
  PrintedMount shoal_mount = w.Mounts("shoal-view");
  CHECK(shoal_mount.type == "overlay");
  PrintedMount native_mount = w.Mounts("native-view", "native");
  {
    ScopedMount a(shoal_mount, w.dir.Sub("mnt-shoal"));
    ScopedMount b(native_mount, w.dir.Sub("mnt-native"));
    CheckSameFiles(SnapshotTree(w.dir.Sub("mnt-shoal")), SnapshotTree(w.dir.Sub("mnt-native")));
  }

  // containerd's own garbage collection removes the snapshots once the image is gone.
  w.Snap({"rm", "shoal-view"});
  w.Snap({"rm", "native-view"}, "native");
  auto removed = w.containerd->Ctr({"images", "rm", "--sync", "gcr.io/proj/img:1"});
  REQUIRE_MESSAGE(removed.has_value(), Why(removed));
  bool collected = WaitUntil([&] { return Rows(w.Snap({"ls"})).empty(); }, std::chrono::seconds(30),
                             std::chrono::milliseconds(200));
  CHECK(collected);
  CHECK(WaitUntil([&] { return Entries(w.SnapshotsDir()) == 0; }, std::chrono::seconds(30),
                  std::chrono::milliseconds(100)));
  CHECK(MountsUnder(w.dir.path()).empty());
}

TEST_CASE(
    "snapshotter: a CRI pull gets its layers prepared by shoal (fetched through the "
    "agent) and containerd fetches and unpacks none of them, so its content store lacks "
    "them until ctr content fetch") {
  World w(true, /*cri=*/true);
  // Three layers, one per compression: files, links, a whiteout and an opaque directory.
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 12, {1ull << 20}, 1901});
  LayerSpec mid{Compression::kZstd, 8, {300000}, 1902};
  mid.with_whiteout = true;
  spec.layers.push_back(mid);
  spec.layers.push_back(LayerSpec{Compression::kNone, 5, {}, 1903});
  const std::string layout = w.dir.Sub("layout");
  auto built = BuildImage(spec, layout, "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  REQUIRE(PushImage(*w.registry, layout, "1", "proj/cri").has_value());
  w.proxy->Reset();

  // The kubelet's call: CRI PullImage. It answers with the image ID.
  auto pulled = CriPullImage(w.containerd->Socket(), "gcr.io/proj/cri:1");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail() +
                                       "\n" + w.containerd->LogTail()));
  CHECK(pulled.value() == built.value().config_digest.str());

  // Every layer was prepared by the agent; none was left to containerd.
  const std::vector<std::string> chains = ChainIds(built.value().diff_ids);
  const std::string log = w.agent->Log();
  for (const std::string& chain : chains) {
    CAPTURE(chain);
    CHECK(log.find("snapshotter: prepared layer " + chain) != std::string::npos);
  }
  CHECK(log.find("left to containerd") == std::string::npos);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "prepared"}}) == 3);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "fallback"}}) == 0);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_extracted_total") == 3);
  // containerd fetched only the image config from the shim, no layer; the upstream served each
  // blob once (to the agent).
  uint64_t layer_bytes = 0;
  for (uint64_t n : built.value().layer_sizes) layer_bytes += n;
  const uint64_t config_bytes = built.value().total_blob_bytes - layer_bytes;
  CHECK(ShimBlobBytes(*w.agent) == static_cast<double>(config_bytes));
  CHECK(w.proxy->BlobBytes() == built.value().total_blob_bytes);
  for (const Digest& d : built.value().layer_digests) CHECK(w.proxy->BlobGets(d) == 1);

  // containerd's view: one committed snapshot per layer, named by chain ID, each on the one
  // below, in the CRI's namespace.
  std::map<std::string, std::vector<std::string>> listed;
  for (auto& row : Rows(w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter", "shoal", "ls"})))
    listed[row[0]] = row;
  REQUIRE(listed.size() == 3);
  CHECK(listed[chains[0]] == std::vector<std::string>{chains[0], "Committed"});
  CHECK(listed[chains[1]] == std::vector<std::string>{chains[1], chains[0], "Committed"});
  CHECK(listed[chains[2]] == std::vector<std::string>{chains[2], chains[1], "Committed"});

  // containerd skipped the layers' fetch, so its content store has only the manifest and the
  // config: `ctr images check` calls the image incomplete (unpacked in shoal) and `ctr images
  // export` fails on the first layer. `ctr content fetch` through the agent fills it in (from
  // the agent's cache: no upstream request), and then both work.
  const std::string ref = "gcr.io/proj/cri:1";
  std::string checked;
  auto check_row = [&] {
    checked = w.Ctr({"-n", "k8s.io", "images", "check", "--snapshotter", "shoal"});
    for (auto& row : Rows(checked)) {
      if (row[0] == ref) return row;
    }
    return std::vector<std::string>{};
  };
  std::vector<std::string> row = check_row();  // REF TYPE DIGEST STATUS... SIZE UNPACKED
  CAPTURE(checked);
  REQUIRE(row.size() > 5);
  CHECK(row[3] == "incomplete");
  CHECK(row[4] == "(1/4)");
  CHECK(row.back() == "true");
  auto exported = w.containerd->Ctr(
      {"-n", "k8s.io", "images", "export", w.dir.Sub("image.tar"), ref}, std::chrono::seconds(60));
  REQUIRE_FALSE(exported.has_value());
  CHECK_MESSAGE(
      exported.error().message.find("content digest " + built.value().layer_digests[0].str() +
                                    ": not found") != std::string::npos,
      exported.error().message);
  w.Ctr({"-n", "k8s.io", "content", "fetch", "--hosts-dir", w.hosts_dir, ref});
  for (const Digest& d : built.value().layer_digests) CHECK(w.proxy->BlobGets(d) == 1);
  row = check_row();
  REQUIRE(row.size() > 5);
  CHECK(row[3] == "complete");
  CHECK(row[4] == "(4/4)");
  w.Ctr({"-n", "k8s.io", "images", "export", w.dir.Sub("image.tar"), ref});
  const std::string listing = w.Ctr({"-n", "k8s.io", "content", "ls"});
  for (const Digest& d : built.value().layer_digests) {
    CHECK(listing.find(d.str()) != std::string::npos);
  }

  // The same image unpacked by containerd's native snapshotter mounts to the same tree.
  auto native = w.containerd->Pull(w.hosts_dir, "gcr.io/proj/cri:1", "native");
  REQUIRE_MESSAGE(native.has_value(), Why(native));
  CheckSameAsNative(w, chains[2]);

  // A second pull of the image: nothing is fetched or extracted again.
  const double shim_before = ShimBlobBytes(*w.agent);
  auto again = CriPullImage(w.containerd->Socket(), "gcr.io/proj/cri:1");
  REQUIRE_MESSAGE(again.has_value(), Why(again));
  CHECK(ShimBlobBytes(*w.agent) == shim_before);

  // containerd's garbage collection removes shoal's snapshots once the image is gone (the CRI
  // names it by tag, digest and ID).
  std::istringstream names(w.Ctr({"-n", "k8s.io", "images", "ls", "-q"}));
  for (std::string name; std::getline(names, name);) {
    if (!name.empty()) w.Ctr({"-n", "k8s.io", "images", "rm", "--sync", name});
  }
  CHECK(WaitUntil(
      [&] {
        return Rows(w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter", "shoal", "ls"})).empty();
      },
      std::chrono::seconds(30), std::chrono::milliseconds(200)));
  CHECK(WaitUntil([&] { return Entries(w.SnapshotsDir()) == 0; }, std::chrono::seconds(30),
                  std::chrono::milliseconds(100)));
  CHECK(MountsUnder(w.dir.path()).empty());
}

TEST_CASE("snapshotter: a layer shoal cannot prepare in time is left to containerd and the CRI "
          "pull still succeeds with the same tree") {
  // Layers get 1.5 s; the middle one takes about 3 s through the throttled upstream.
  World w(true, /*cri=*/true, {"--snapshotter-prepare-timeout-ms", "1500"});
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 10, {}, 2001});
  LayerSpec big{Compression::kGzip, 4, {6ull << 20}, 2002};
  big.with_whiteout = true;
  spec.layers.push_back(big);
  spec.layers.push_back(LayerSpec{Compression::kGzip, 6, {}, 2003});
  const std::string layout = w.dir.Sub("layout");
  auto built = BuildImage(spec, layout, "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  REQUIRE(PushImage(*w.registry, layout, "1", "proj/slow").has_value());
  REQUIRE(built.value().layer_sizes.at(1) > (2u << 20));
  w.proxy->Reset();
  w.proxy->SetDelayPerMiB(std::chrono::milliseconds(1000));

  auto pulled = CriPullImage(w.containerd->Socket(), "gcr.io/proj/slow:1");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail() +
                                       "\n" + w.containerd->LogTail()));
  w.proxy->SetDelayPerMiB(std::chrono::milliseconds(0));
  const std::vector<std::string> chains = ChainIds(built.value().diff_ids);
  const std::string log = w.agent->Log();
  CHECK(log.find("snapshotter: prepared layer " + chains[0]) != std::string::npos);
  CHECK_MESSAGE(log.find("snapshotter: layer " + chains[1] + " left to containerd: layer " +
                         built.value().layer_digests[1].str() + " not extracted within 1500 ms") !=
                    std::string::npos,
                log);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "fallback"}}) >= 1);
  // containerd fetched that layer through the shim, which joined the agent's fetch: the
  // upstream still served each blob once.
  CHECK(ShimBlobBytes(*w.agent) >= static_cast<double>(built.value().layer_sizes[1]));
  CHECK(w.proxy->BlobGets(built.value().layer_digests[1]) == 1);

  std::map<std::string, std::vector<std::string>> listed;
  for (auto& row : Rows(w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter", "shoal", "ls"})))
    listed[row[0]] = row;
  REQUIRE(listed.size() == 3);
  CHECK(listed[chains[2]] == std::vector<std::string>{chains[2], chains[1], "Committed"});
  auto native = w.containerd->Pull(w.hosts_dir, "gcr.io/proj/slow:1", "native");
  REQUIRE_MESSAGE(native.has_value(), Why(native));
  CheckSameAsNative(w, chains[2]);
  CHECK(MountsUnder(w.dir.path()).empty());
}

TEST_CASE(
    "snapshotter: a prefetch with --snapshots extracts every layer beforehand, and a CRI "
    "pull after an agent restart extracts nothing") {
  World w(true, /*cri=*/true);
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 10, {1ull << 20}, 2101});
  LayerSpec mid{Compression::kZstd, 6, {200000}, 2102};
  mid.with_whiteout = true;
  spec.layers.push_back(mid);
  spec.layers.push_back(LayerSpec{Compression::kGzip, 4, {}, 2103});
  const std::string layout = w.dir.Sub("layout");
  auto built = BuildImage(spec, layout, "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  REQUIRE(PushImage(*w.registry, layout, "1", "proj/pre").has_value());
  w.proxy->Reset();

  // The operator's prefetch before the experiment: blobs cached and layers extracted.
  auto prefetched = Shoalctl(
      {"prefetch", "gcr.io/proj/pre:1", "--agent", w.agent->Url(), "--snapshots", "--json"});
  REQUIRE_MESSAGE(prefetched.has_value(),
                  (Why(prefetched) + "\n" + w.agent->LogTail()));
  auto result = nlohmann::json::parse(prefetched.value(), nullptr, false);
  REQUIRE_MESSAGE(result.is_object(), prefetched.value());
  CHECK_MESSAGE(result.value("ok", false), prefetched.value());
  const nlohmann::json& job = result["job"];
  CHECK(job["state"] == "done");
  CHECK(job["snapshots"]["layers"] == 3);
  CHECK(job["snapshots"]["prepared"] == 3);
  CHECK(job["snapshots"]["failed"] == 0);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_extracted_total") == 3);
  CHECK(w.agent->Metric("shoal_snapshotter_bytes", {{"state", "staged"}}) > (1 << 20));
  // containerd knows nothing yet: the layers wait in staging for its Prepares.
  CHECK(Rows(w.Ctr({"-n", "k8s.io", "snapshots", "--snapshotter", "shoal", "ls"})).empty());

  // The agent restarts (an upgrade, a crash) before the pod starts: the staged layers stay.
  REQUIRE_MESSAGE(w.agent->Restart().has_value(), w.agent->LogTail());
  CHECK(w.agent->Log().find("3 staged layers") != std::string::npos);
  // The restarted agent listens on another port here: containerd reads hosts.toml at each pull.
  auto regenerated = Shoalctl({"config", "containerd", "--agent", w.agent->HostPort(), "--registry",
                               "gcr.io", "-o", w.hosts_dir});
  REQUIRE_MESSAGE(regenerated.has_value(), Why(regenerated));
  const uint64_t upstream_before = w.proxy->BlobBytes();
  CHECK(upstream_before == built.value().total_blob_bytes);
  w.WaitUntilContainerdReconnects();

  auto pulled = CriPullImage(w.containerd->Socket(), "gcr.io/proj/pre:1");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail() +
                                       "\n" + w.containerd->LogTail()));
  CHECK(pulled.value() == built.value().config_digest.str());
  // Every layer came from staging: prepared, none extracted by this agent process, none left to
  // containerd, nothing fetched upstream again.
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "prepared"}}) == 3);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "fallback"}}) == 0);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_extracted_total") == 0);
  CHECK(w.agent->Metric("shoal_snapshotter_bytes", {{"state", "staged"}}) == 0);
  CHECK(w.agent->Metric("shoal_snapshotter_bytes", {{"state", "committed"}}) > (1 << 20));
  CHECK(w.proxy->BlobBytes() == upstream_before);
  const std::vector<std::string> chains = ChainIds(built.value().diff_ids);
  auto native = w.containerd->Pull(w.hosts_dir, "gcr.io/proj/pre:1", "native");
  REQUIRE_MESSAGE(native.has_value(), Why(native));
  CheckSameAsNative(w, chains[2]);
  CHECK(MountsUnder(w.dir.path()).empty());
}

TEST_CASE(
    "snapshotter: extracted layers count in the agent's cache budget, blobs make room for "
    "them, and containerd's garbage collection gives the space back") {
  // About 3 MiB of blobs that extract to about 6 MiB: the budget holds the layers and some of
  // the blobs, not all of them.
  const uint64_t budget = 15ull << 19;  // 7.5 MiB
  World w(true, /*cri=*/true, {"--cache-budget", std::to_string(budget)});
  ImageSpec spec;
  for (uint64_t seed : {2201, 2202, 2203}) {
    spec.layers.push_back(LayerSpec{Compression::kGzip, 3, {2ull << 20}, seed});
  }
  const std::string layout = w.dir.Sub("layout");
  auto built = BuildImage(spec, layout, "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  REQUIRE(PushImage(*w.registry, layout, "1", "proj/budget").has_value());

  auto pulled = CriPullImage(w.containerd->Socket(), "gcr.io/proj/budget:1");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail() +
                                       "\n" + w.containerd->LogTail()));
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "prepared"}}) == 3);
  auto used = [&] {
    return w.agent->Metric("shoal_cache_bytes") +
           w.agent->Metric("shoal_snapshotter_bytes", {{"state", "committed"}}) +
           w.agent->Metric("shoal_snapshotter_bytes", {{"state", "staged"}});
  };
  const double layers_bytes = w.agent->Metric("shoal_snapshotter_bytes", {{"state", "committed"}});
  CHECK(layers_bytes > (6 << 20));
  CHECK(layers_bytes < static_cast<double>(budget));
  // Blobs were evicted, least recently used first, until blobs and layers fit.
  CHECK_MESSAGE(WaitUntil([&] { return used() <= static_cast<double>(budget); },
                          std::chrono::seconds(20), std::chrono::milliseconds(100)),
                w.agent->Metrics());
  CHECK(w.agent->Metric("shoal_cache_evictions_total") >= 1);
  auto cache = HttpRequest("GET", w.agent->Url() + "/shoal/v1/cache");
  REQUIRE(cache.has_value());
  auto cache_json = nlohmann::json::parse(cache.value().body, nullptr, false);
  CHECK(cache_json.value("snapshot_bytes", 0.0) == layers_bytes);

  // containerd removes the image: its snapshots go, and their bytes leave the budget.
  std::istringstream names(w.Ctr({"-n", "k8s.io", "images", "ls", "-q"}));
  for (std::string name; std::getline(names, name);) {
    if (!name.empty()) w.Ctr({"-n", "k8s.io", "images", "rm", "--sync", name});
  }
  CHECK(WaitUntil(
      [&] {
        return w.agent->Metric("shoal_snapshotter_bytes", {{"state", "committed"}}) == 0;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(200)));
  CHECK(MountsUnder(w.dir.path()).empty());
}

TEST_CASE(
    "snapshotter: an agent killed while it extracts a prefetch's layers keeps the finished "
    "ones and deletes the cut one, and the CRI pull still gets the same tree") {
  World w(true, /*cri=*/true);
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 8, {}, 2301});
  spec.layers.push_back(LayerSpec{Compression::kGzip, 6, {}, 2302});
  LayerSpec big{Compression::kGzip, 4, {8ull << 20}, 2303};
  big.with_whiteout = true;
  spec.layers.push_back(big);
  const std::string layout = w.dir.Sub("layout");
  auto built = BuildImage(spec, layout, "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  REQUIRE(PushImage(*w.registry, layout, "1", "proj/cut").has_value());
  REQUIRE(built.value().layer_sizes.at(2) > (3u << 20));
  // The big layer streams in over seconds, and is extracted as it comes.
  w.proxy->SetDelayPerMiB(std::chrono::milliseconds(1500));
  auto started = HttpRequest(
      "POST", w.agent->Url() + "/shoal/v1/prefetch?ref=gcr.io/proj/cut:1" + "&snapshots=1");
  REQUIRE(started.has_value());
  REQUIRE_MESSAGE(started.value().status == 202, started.value().body);

  // Two layers extracted and recorded, the third one's directory partly written: a crash.
  const std::string staging = w.dir.Sub("cache/snapshotter/staging");
  auto count = [&](bool records) {
    size_t n = 0;
    std::error_code ec;
    for (fs::directory_iterator it(staging, ec), end; !ec && it != end; it.increment(ec)) {
      const bool record = it->path().extension() == ".json";
      n += record == records;
    }
    return n;
  };
  const std::string big_prefix = built.value().layer_digests[2].hex().substr(0, 16);
  auto big_started = [&] {
    std::error_code ec;
    for (fs::directory_iterator it(staging, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().filename().string().rfind(big_prefix, 0) == 0) return true;
    }
    return false;
  };
  REQUIRE_MESSAGE(WaitUntil([&] { return count(true) == 2 && big_started(); },
                            std::chrono::seconds(30), std::chrono::milliseconds(20)),
                  w.agent->LogTail());
  w.agent->Kill();
  CHECK(count(false) == 3);
  w.proxy->SetDelayPerMiB(std::chrono::milliseconds(0));

  REQUIRE_MESSAGE(w.agent->Restart().has_value(), w.agent->LogTail());
  CHECK(w.agent->Log().find("2 staged layers") != std::string::npos);
  CHECK(count(false) == 2);  // the cut directory went
  CHECK(count(true) == 2);
  CHECK_FALSE(big_started());
  auto regenerated = Shoalctl({"config", "containerd", "--agent", w.agent->HostPort(), "--registry",
                               "gcr.io", "-o", w.hosts_dir});
  REQUIRE_MESSAGE(regenerated.has_value(), Why(regenerated));
  w.WaitUntilContainerdReconnects();

  auto pulled = CriPullImage(w.containerd->Socket(), "gcr.io/proj/cut:1");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail() +
                                       "\n" + w.containerd->LogTail()));
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "prepared"}}) == 3);
  CHECK(w.agent->Metric("shoal_snapshotter_layers_extracted_total") == 1);  // the cut one again
  const std::vector<std::string> chains = ChainIds(built.value().diff_ids);
  auto native = w.containerd->Pull(w.hosts_dir, "gcr.io/proj/cut:1", "native");
  REQUIRE_MESSAGE(native.has_value(), Why(native));
  CheckSameAsNative(w, chains[2]);
  CHECK(MountsUnder(w.dir.path()).empty());
}

}  // namespace shoal::testkit
