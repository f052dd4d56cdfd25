// `shoalctl node-setup`, the agent DaemonSet's init container, run as the built binary against
// a temp directory that stands for the node's / (what the pod sees at /host through its
// hostPath volumes), and against the real dockerd and containerd of the test kit. Kubernetes
// itself is not involved: the chart's test checks that the pod passes these same flags.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <tuple>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "tests/support/agent.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/cri.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

namespace fs = std::filesystem;

// Runs shoalctl with args; returns (exit code, output).
std::pair<int, std::string> Ctl(const std::vector<std::string>& args) {
  std::string cmd = std::string("'") + SHOAL_CTL_BIN + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  auto r = RunCommand({"sh", "-c", cmd + " 2>&1; echo \"exit=$?\""}, std::chrono::seconds(60));
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  std::string out = r.value();
  auto pos = out.rfind("exit=");
  REQUIRE(pos != std::string::npos);
  return {std::stoi(out.substr(pos + 5)), out.substr(0, pos)};
}

struct stat StatOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st;
}

TEST_CASE(
    "node-setup: writes each enabled part atomically, is idempotent, and cleanup takes back only "
    "its own") {
  TempDir host("shoal-host");
  const std::string original_daemon =
      R"({"log-driver": "json-file", "registry-mirrors": ["https://mirror.example"], )"
      R"("max-concurrent-downloads": 3, "data-root": "/mnt/docker"})";
  fs::create_directories(host.Sub("etc/docker"));
  WriteFile(host.Sub("etc/docker/daemon.json"), original_daemon);
  ::chmod(host.Sub("etc/docker/daemon.json").c_str(), 0600);
  fs::create_directories(host.Sub("etc/containerd/certs.d/quay.io"));
  WriteFile(host.Sub("etc/containerd/config.toml"), "version = 2\n");
  // The operator's own hosts.toml for quay.io: never touched.
  const std::string theirs = "server = \"https://quay.io\"\n";
  WriteFile(host.Sub("etc/containerd/certs.d/quay.io/hosts.toml"), theirs);

  const std::vector<std::string> args = {"node-setup",
                                         "--root",
                                         host.path(),
                                         "--agent",
                                         "127.0.0.1:5000",
                                         "--registry",
                                         "docker.io,gcr.io,quay.io",
                                         "--containerd-certs-dir",
                                         "/etc/containerd/certs.d",
                                         "--containerd-config",
                                         "/etc/containerd/config.toml",
                                         "--crio-drop-in",
                                         "/etc/containers/registries.conf.d/50-shoal.conf",
                                         "--dockerd-config",
                                         "/etc/docker/daemon.json",
                                         "--dockerd-pid-file",
                                         "/var/run/docker.pid"};
  int code = 0;
  std::string out;
  std::tie(code, out) = Ctl(args);
  CAPTURE(out);
  CHECK(code == 0);
  // containerd: one managed hosts.toml per registry, pointing at the agent, then the registry.
  std::string gcr = ReadFile(host.Sub("etc/containerd/certs.d/gcr.io/hosts.toml"));
  CHECK(gcr.rfind("# Written by shoal", 0) == 0);
  CHECK(gcr.find("server = \"https://gcr.io\"") != std::string::npos);
  CHECK(gcr.find("[host.\"http://127.0.0.1:5000\"]") != std::string::npos);
  CHECK(ReadFile(host.Sub("etc/containerd/certs.d/docker.io/hosts.toml"))
            .find("server = \"https://registry-1.docker.io\"") != std::string::npos);
  CHECK(ReadFile(host.Sub("etc/containerd/certs.d/quay.io/hosts.toml")) == theirs);
  CHECK(out.find("quay.io/hosts.toml exists and was not written by shoal") != std::string::npos);
  // config_path is not set: said in the log, config.toml left alone.
  CHECK(out.find("config_path is not set") != std::string::npos);
  CHECK(ReadFile(host.Sub("etc/containerd/config.toml")) == "version = 2\n");
  // CRI-O drop-in.
  std::string crio = ReadFile(host.Sub("etc/containers/registries.conf.d/50-shoal.conf"));
  CHECK(crio.find("location = \"127.0.0.1:5000/gcr.io\"") != std::string::npos);
  // dockerd: merged, every other key kept, our mirror first, a backup of the original, mode kept.
  auto daemon = nlohmann::json::parse(ReadFile(host.Sub("etc/docker/daemon.json")));
  CHECK(daemon["log-driver"] == "json-file");
  CHECK(daemon["data-root"] == "/mnt/docker");
  CHECK(daemon["registry-mirrors"] ==
        nlohmann::json::array({"http://127.0.0.1:5000", "https://mirror.example"}));
  CHECK(daemon["max-concurrent-downloads"] == 10);
  CHECK(ReadFile(host.Sub("etc/docker/daemon.json.shoal-backup")) == original_daemon);
  CHECK((StatOf(host.Sub("etc/docker/daemon.json")).st_mode & 0777) == 0600);
  CHECK(out.find("dockerd is not running") != std::string::npos);
  // No temp files left behind.
  for (const auto& e : fs::recursive_directory_iterator(host.path())) {
    CHECK(e.path().string().find(".shoal-tmp") == std::string::npos);
  }

  // Idempotent: a second run (a restarted pod) changes nothing, not even a file's inode.
  auto ino_before = StatOf(host.Sub("etc/docker/daemon.json")).st_ino;
  auto gcr_before = StatOf(host.Sub("etc/containerd/certs.d/gcr.io/hosts.toml")).st_ino;
  int code2 = 0;
  std::string out2;
  std::tie(code2, out2) = Ctl(args);
  CAPTURE(out2);
  CHECK(code2 == 0);
  CHECK(out2.find("created") == std::string::npos);
  CHECK(out2.find("updated") == std::string::npos);
  CHECK(StatOf(host.Sub("etc/docker/daemon.json")).st_ino == ino_before);
  CHECK(StatOf(host.Sub("etc/containerd/certs.d/gcr.io/hosts.toml")).st_ino == gcr_before);

  // The operator changes daemon.json meanwhile; cleanup keeps that change and removes ours.
  daemon["debug"] = true;
  WriteFile(host.Sub("etc/docker/daemon.json"), daemon.dump());
  std::vector<std::string> cleanup = args;
  cleanup.insert(cleanup.begin() + 1, "--cleanup");
  int code3 = 0;
  std::string out3;
  std::tie(code3, out3) = Ctl(cleanup);
  CAPTURE(out3);
  CHECK(code3 == 0);
  CHECK_FALSE(fs::exists(host.Sub("etc/containerd/certs.d/gcr.io")));
  CHECK_FALSE(fs::exists(host.Sub("etc/containerd/certs.d/docker.io")));
  CHECK(ReadFile(host.Sub("etc/containerd/certs.d/quay.io/hosts.toml")) == theirs);
  CHECK_FALSE(fs::exists(host.Sub("etc/containers/registries.conf.d/50-shoal.conf")));
  auto restored = nlohmann::json::parse(ReadFile(host.Sub("etc/docker/daemon.json")));
  auto want = nlohmann::json::parse(original_daemon);
  want["debug"] = true;
  // Emptied, not removed: dockerd's reload only applies keys that are in the file.
  want["insecure-registries"] = nlohmann::json::array();
  CHECK(restored == want);
  CHECK_FALSE(fs::exists(host.Sub("etc/docker/daemon.json.shoal-backup")));
}

TEST_CASE("node-setup: nothing enabled writes nothing, bad daemon.json is left alone") {
  TempDir host("shoal-host");
  int code = 0;
  std::string out;
  std::tie(code, out) = Ctl({"node-setup", "--root", host.path()});
  CHECK(code == 0);
  CHECK(out.find("nothing enabled") != std::string::npos);
  CHECK(fs::is_empty(host.path()));

  fs::create_directories(host.Sub("etc/docker"));
  WriteFile(host.Sub("etc/docker/daemon.json"), "{not json");
  int code2 = 0;
  std::string out2;
  std::tie(code2, out2) =
      Ctl({"node-setup", "--root", host.path(), "--dockerd-config", "/etc/docker/daemon.json"});
  CAPTURE(out2);
  CHECK(code2 == 1);
  CHECK(ReadFile(host.Sub("etc/docker/daemon.json")) == "{not json");
  CHECK_FALSE(fs::exists(host.Sub("etc/docker/daemon.json.shoal-backup")));
}

TEST_CASE("node-setup: ARP thresholds are raised, never lowered") {
  TempDir proc("shoal-proc");
  fs::create_directories(proc.Sub("sys/net/ipv4/neigh/default"));
  WriteFile(proc.Sub("sys/net/ipv4/neigh/default/gc_thresh1"), "128\n");
  WriteFile(proc.Sub("sys/net/ipv4/neigh/default/gc_thresh2"), "512\n");
  WriteFile(proc.Sub("sys/net/ipv4/neigh/default/gc_thresh3"), "200000\n");
  int code = 0;
  std::string out;
  std::tie(code, out) =
      Ctl({"node-setup", "--proc", proc.path(), "--arp-gc-thresh", "80000,90000,100000"});
  CAPTURE(out);
  CHECK(code == 0);
  CHECK(ReadFile(proc.Sub("sys/net/ipv4/neigh/default/gc_thresh1")) == "80000\n");
  CHECK(ReadFile(proc.Sub("sys/net/ipv4/neigh/default/gc_thresh2")) == "90000\n");
  CHECK(ReadFile(proc.Sub("sys/net/ipv4/neigh/default/gc_thresh3")) == "200000\n");
  int bad = 0;
  std::string bad_out;
  std::tie(bad, bad_out) = Ctl({"node-setup", "--proc", proc.path(), "--arp-gc-thresh", "1,2"});
  CHECK(bad == 2);
}

// One upstream registry behind a counting proxy and one agent, as in the runtime tests; with
// `snapshotter`, the agent also serves containerd's snapshots API on Socket().
struct World {
  TempDir dir{"shoal-node-setup"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<Agent> agent;

  std::string Socket() const { return dir.Sub("snapshotter.sock"); }

  explicit World(bool snapshotter = false) {
    auto up = CountedUpstream::Start();
    REQUIRE_MESSAGE(up.has_value(), Why(up));
    registry = std::move(up.value().registry);
    proxy = std::move(up.value().proxy);
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache");
    opts.upstreams = {"docker.io=" + proxy->Url(), "gcr.io=" + proxy->Url()};
    opts.extra_args = {"--unmapped", "error"};
    if (snapshotter) {
      opts.extra_args.insert(opts.extra_args.end(), {"--snapshotter-socket", Socket()});
    }
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agent = std::move(a.value());
  }

  BuiltImage Push(const std::string& name, const std::string& tag, uint64_t seed) {
    ImageSpec spec;
    spec.layers.push_back(LayerSpec{Compression::kGzip, 8, {256u << 10}, seed});
    std::string layout = dir.Sub("layout-" + std::to_string(seed));
    auto built = BuildImage(spec, layout, tag);
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    auto pushed = PushImage(*registry, layout, tag, name);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return built.value();
  }
};

TEST_CASE(
    "node-setup: a running dockerd gets the mirror by SIGHUP, without a restart, and pulls through "
    "the agent") {
  World w;
  BuiltImage image = w.Push("library/hello", "1", 7001);
  auto dockerd = Dockerd::Start(R"({"labels": ["kept=yes"], "max-concurrent-downloads": 4})");
  REQUIRE_MESSAGE(dockerd.has_value(), Why(dockerd));
  Dockerd& d = *dockerd.value();
  pid_t pid = d.Pid();
  auto before = d.Docker({"info", "--format", "{{json .RegistryConfig.Mirrors}}"});
  REQUIRE(before.has_value());
  CHECK(before.value().find(w.agent->HostPort()) == std::string::npos);

  // --root "/" with absolute paths: the test's dockerd files stand where a node's would be.
  int code = 0;
  std::string out;
  std::tie(code, out) =
      Ctl({"node-setup", "--root", "/", "--agent", w.agent->HostPort(), "--dockerd-config",
           d.DaemonJsonPath(), "--dockerd-pid-file", d.PidFilePath()});
  CAPTURE(out);
  REQUIRE(code == 0);
  CHECK(out.find("sent SIGHUP to dockerd (pid " + std::to_string(pid) + ")") != std::string::npos);
  // dockerd reloads asynchronously; `docker info` shows the mirror once it has.
  std::string mirrors;
  CHECK(WaitUntil(
      [&] {
        auto info = d.Docker({"info", "--format", "{{json .RegistryConfig.Mirrors}}"});
        mirrors = info ? info.value() : "";
        return mirrors.find("http://" + w.agent->HostPort()) != std::string::npos;
      },
      std::chrono::seconds(15), std::chrono::milliseconds(200)));
  CAPTURE(mirrors);
  CHECK(d.Pid() == pid);
  auto daemon = nlohmann::json::parse(ReadFile(d.DaemonJsonPath()));
  CHECK(daemon["max-concurrent-downloads"] == 10);
  CHECK(daemon["labels"] == nlohmann::json::array({"kept=yes"}));

  auto pulled = d.Docker({"pull", "hello:1"});
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + d.LogTail()));
  auto digest = d.RepoDigest("hello:1");
  REQUIRE(digest.has_value());
  CHECK(digest.value() == image.manifest_digest.str());
  CHECK(w.proxy->BlobBytes() == image.total_blob_bytes);

  // Cleanup: the mirror goes, by SIGHUP again.
  int code2 = 0;
  std::string out2;
  std::tie(code2, out2) =
      Ctl({"node-setup", "--cleanup", "--root", "/", "--agent", w.agent->HostPort(),
           "--dockerd-config", d.DaemonJsonPath(), "--dockerd-pid-file", d.PidFilePath()});
  CAPTURE(out2);
  CHECK(code2 == 0);
  CHECK(WaitUntil(
      [&] {
        auto info = d.Docker({"info", "--format", "{{json .RegistryConfig.Mirrors}}"});
        return info && info.value().find(w.agent->HostPort()) == std::string::npos;
      },
      std::chrono::seconds(15), std::chrono::milliseconds(200)));
  CHECK(nlohmann::json::parse(ReadFile(d.DaemonJsonPath()))["max-concurrent-downloads"] == 4);
  CHECK(d.Pid() == pid);
}

TEST_CASE(
    "node-setup: containerd pulls through the hosts.toml that node-setup wrote into the host's "
    "certs.d") {
  World w;
  BuiltImage image = w.Push("proj/img", "1", 7101);
  TempDir host("shoal-host");
  int code = 0;
  std::string out;
  std::tie(code, out) =
      Ctl({"node-setup", "--root", host.path(), "--agent", w.agent->HostPort(), "--registry",
           "gcr.io", "--containerd-certs-dir", "/etc/containerd/certs.d"});
  CAPTURE(out);
  REQUIRE(code == 0);
  auto containerd = Containerd::Start();
  REQUIRE_MESSAGE(containerd.has_value(), Why(containerd));
  Containerd& c = *containerd.value();
  auto pulled = c.Pull(host.Sub("etc/containerd/certs.d"), "gcr.io/proj/img:1");
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + w.agent->LogTail()));
  auto digest = c.ImageDigest("gcr.io/proj/img:1");
  REQUIRE(digest.has_value());
  CHECK(digest.value() == image.manifest_digest.str());
  CHECK(w.proxy->BlobBytes() == image.total_blob_bytes);
}

// `text` parsed with toml++; REQUIREs that it parses.
toml::table ParseToml(const std::string& text) {
  try {
    return toml::parse(text);
  } catch (const toml::parse_error& e) {
    FAIL("not TOML: ", e.description(), " at line ", e.source().begin.line, "\n", text);
  }
  return {};
}

// `containerd --config PATH config dump`: the configuration containerd would run with (it
// fails on TOML containerd cannot read). REQUIREs success.
std::string ConfigDump(const std::string& path) {
  auto out =
      RunCommand({"containerd", "--config", path, "config", "dump"}, std::chrono::seconds(30));
  REQUIRE_MESSAGE(out.has_value(),
                  ("containerd config dump " + path + ": " + Why(out)));
  return out.value();
}

// The lines of b that a lacks ("+ line") and of a that b lacks ("- line"), blank lines aside,
// sorted: what changed between two dumps.
std::vector<std::string> LineChanges(const std::string& a, const std::string& b) {
  std::map<std::string, int> count;
  std::istringstream ia(a), ib(b);
  for (std::string l; std::getline(ia, l);)
    if (!l.empty()) --count[l];
  for (std::string l; std::getline(ib, l);)
    if (!l.empty()) ++count[l];
  std::vector<std::string> out;
  for (const auto& kv : count) {
    for (int i = 0; i < kv.second; ++i) out.push_back("+ " + kv.first);
    for (int i = 0; i < -kv.second; ++i) out.push_back("- " + kv.first);
  }
  return out;
}

TEST_CASE(
    "node-setup: the containerd snapshotter opt-in edits config.toml in place so that the real "
    "containerd loads the shoal proxy plugin and the CRI pull is prepared by the agent, and "
    "cleanup restores the file byte for byte") {
  World w(/*snapshotter=*/true);
  BuiltImage image = w.Push("proj/img", "1", 7201);
  const std::string hosts_dir = w.dir.Sub("certs.d");
  auto hosts = Shoalctl({"config", "containerd", "--agent", w.agent->HostPort(), "--registry",
                         "gcr.io", "-o", hosts_dir});
  REQUIRE_MESSAGE(hosts.has_value(), Why(hosts));
  // The CRI's table as `containerd config default` writes it: containerd's own snapshotter and
  // snapshot annotations off (1.6's defaults), beside settings node-setup must keep.
  const std::string cri_settings =
      "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n"
      "  snapshotter = \"overlayfs\"\n"
      "  disable_snapshot_annotations = true  # the 1.6 default\n"
      "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n"
      "  config_path = \"" +
      hosts_dir + "\"\n";
  std::string config, original, edited, setup_out;
  const std::vector<std::string> setup_args = {"node-setup", "--root", "/", "--containerd-config"};
  auto containerd = Containerd::Start(cri_settings, /*cri=*/true, [&](const std::string& path) {
    config = path;
    original = ReadFile(path);
    std::vector<std::string> args = setup_args;
    args.insert(args.end(), {path, "--containerd-snapshotter", "--snapshotter-socket", w.Socket()});
    int code = 0;
    std::tie(code, setup_out) = Ctl(args);
    CHECK(code == 0);
    edited = ReadFile(path);
  });
  REQUIRE_MESSAGE(containerd.has_value(), Why(containerd));
  Containerd& c = *containerd.value();
  CAPTURE(setup_out);
  CAPTURE(edited);
  CHECK(setup_out.find("restart it (`systemctl restart containerd`") != std::string::npos);
  // Changed lines keep the original in their comment; the proxy plugin is a marked block.
  CHECK(edited.find("  snapshotter = \"shoal\"  # shoal-node-setup: was:   snapshotter = "
                    "\"overlayfs\"\n") != std::string::npos);
  CHECK(edited.find("  disable_snapshot_annotations = false  # shoal-node-setup: was:   "
                    "disable_snapshot_annotations = true  # the 1.6 default\n") !=
        std::string::npos);
  CHECK(edited.find("[proxy_plugins.shoal]\n  type = \"snapshot\"\n  address = \"" + w.Socket() +
                    "\"\n# shoal-node-setup: end\n") != std::string::npos);
  CHECK(ReadFile(config + ".shoal-backup") == original);
  CHECK((StatOf(config + ".shoal-backup").st_mode & 0777) == 0600);
  // Everything else is as it was: containerd's merged view differs in the shoal settings only.
  std::string dump = ConfigDump(config);
  CHECK(dump.find("config_path = \"" + hosts_dir + "\"") != std::string::npos);

  // containerd loaded the agent's snapshotter as a proxy plugin.
  auto plugins = c.Ctr({"plugins", "ls"});
  REQUIRE_MESSAGE(plugins.has_value(), Why(plugins));
  std::string shoal_row;
  std::istringstream rows(plugins.value());
  for (std::string row; std::getline(rows, row);) {
    std::istringstream cols(row);
    std::string type, id;
    cols >> type >> id;
    if (type == "io.containerd.snapshotter.v1" && id == "shoal") shoal_row = row;
  }
  CAPTURE(plugins.value());
  CHECK(shoal_row.find(" ok") != std::string::npos);

  // `shoalctl config containerd --snapshotter` prints the same four settings (one code path):
  // parsed with toml++, they are the values of the file containerd just loaded. With -o the
  // hosts.toml files are written and everything else printed is a TOML comment.
  auto printed = Shoalctl({"config", "containerd", "--snapshotter", "--snapshotter-socket",
                           w.Socket(), "--agent", w.agent->HostPort(), "--registry", "gcr.io", "-o",
                           w.dir.Sub("certs-printed")});
  REQUIRE_MESSAGE(printed.has_value(), Why(printed));
  CAPTURE(printed.value());
  const toml::table snippet = ParseToml(printed.value());
  const toml::table loaded = ParseToml(edited);
  const auto proxy = snippet["proxy_plugins"]["shoal"];
  const auto cri = snippet["plugins"]["io.containerd.grpc.v1.cri"]["containerd"];
  CHECK(proxy["type"].value<std::string>() == "snapshot");
  CHECK(proxy["address"].value<std::string>() == w.Socket());
  CHECK(cri["snapshotter"].value<std::string>() == "shoal");
  CHECK(cri["disable_snapshot_annotations"].value<bool>() == false);
  CHECK(proxy["type"].value<std::string>() ==
        loaded["proxy_plugins"]["shoal"]["type"].value<std::string>());
  CHECK(proxy["address"].value<std::string>() ==
        loaded["proxy_plugins"]["shoal"]["address"].value<std::string>());
  const auto loaded_cri = loaded["plugins"]["io.containerd.grpc.v1.cri"]["containerd"];
  CHECK(cri["snapshotter"].value<std::string>() == loaded_cri["snapshotter"].value<std::string>());
  CHECK(cri["disable_snapshot_annotations"].value<bool>() ==
        loaded_cri["disable_snapshot_annotations"].value<bool>());
  CHECK(snippet.size() == 2);  // proxy_plugins and plugins: nothing else
  CHECK(fs::exists(w.dir.Sub("certs-printed/gcr.io/hosts.toml")));

  // The kubelet's pull uses it, with the layer labels: the agent prepared the layer itself.
  auto pulled = CriPullImage(c.Socket(), "gcr.io/proj/img:1");
  REQUIRE_MESSAGE(pulled.has_value(),
                  (Why(pulled) + "\n" + w.agent->LogTail() + "\n" + c.LogTail()));
  CHECK(pulled.value() == image.config_digest.str());
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "prepared"}}) ==
        static_cast<double>(image.layer_digests.size()));
  CHECK(w.agent->Metric("shoal_snapshotter_layers_total", {{"result", "fallback"}}) == 0);

  // Again (a restarted init container): nothing changes.
  std::vector<std::string> args = setup_args;
  args.insert(args.end(), {config, "--containerd-snapshotter", "--snapshotter-socket", w.Socket()});
  int code = 0;
  std::string out;
  std::tie(code, out) = Ctl(args);
  CAPTURE(out);
  CHECK(code == 0);
  CHECK(out.find(config + " unchanged") != std::string::npos);
  CHECK(ReadFile(config) == edited);

  // Cleanup: the original bytes, no backup, and the restart said.
  args.insert(args.begin() + 1, "--cleanup");
  std::tie(code, out) = Ctl(args);
  CHECK(code == 0);
  CHECK(ReadFile(config) == original);
  CHECK_FALSE(fs::exists(config + ".shoal-backup"));
  CHECK(out.find("restart containerd") != std::string::npos);
  std::tie(code, out) = Ctl(args);
  CHECK(code == 0);
  CHECK(out.find("nothing of shoal's to remove") != std::string::npos);
}

TEST_CASE(
    "node-setup: the containerd snapshotter opt-in changes only its settings in containerd's "
    "default config and a minimal one, and leaves an operator's proxy plugin and other config "
    "versions alone") {
  TempDir host("shoal-host");
  const std::string path = host.Sub("etc/containerd/config.toml");
  fs::create_directories(host.Sub("etc/containerd"));
  const std::vector<std::string> args = {"node-setup",
                                         "--root",
                                         host.path(),
                                         "--containerd-config",
                                         "/etc/containerd/config.toml",
                                         "--containerd-snapshotter"};
  std::vector<std::string> cleanup = args;
  cleanup.insert(cleanup.begin() + 1, "--cleanup");
  int code = 0;
  std::string out;

  // What `containerd config default` writes (a node image's usual config.toml).
  auto defaults = RunCommand({"containerd", "config", "default"}, std::chrono::seconds(30));
  REQUIRE(defaults.has_value());
  WriteFile(path, defaults.value());
  const std::string before = ConfigDump(path);
  std::tie(code, out) = Ctl(args);
  CAPTURE(out);
  CHECK(code == 0);
  const std::vector<std::string> want = {
      "+     address = \"/run/shoal/snapshotter.sock\"",
      "+     type = \"snapshot\"",
      "+       disable_snapshot_annotations = false",
      "+       snapshotter = \"shoal\"",
      "+   [proxy_plugins.shoal]",
      "-       disable_snapshot_annotations = true",
      "-       snapshotter = \"overlayfs\"",
  };
  std::vector<std::string> changes = LineChanges(before, ConfigDump(path));
  std::sort(changes.begin(), changes.end());
  std::vector<std::string> sorted_want = want;
  std::sort(sorted_want.begin(), sorted_want.end());
  CHECK(changes == sorted_want);
  std::tie(code, out) = Ctl(args);
  CHECK(out.find("unchanged") != std::string::npos);
  std::tie(code, out) = Ctl(cleanup);
  CHECK(code == 0);
  CHECK(ReadFile(path) == defaults.value());

  // A minimal config without the CRI's containerd table: the table is added in shoal's block,
  // and the CRI's other settings stay.
  const std::string minimal =
      "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n"
      "  config_path = \"/etc/containerd/certs.d\"\n";
  WriteFile(path, minimal);
  std::tie(code, out) = Ctl(args);
  CHECK(code == 0);
  std::string dump = ConfigDump(path);
  CHECK(dump.find("config_path = \"/etc/containerd/certs.d\"") != std::string::npos);
  CHECK(dump.find("snapshotter = \"shoal\"") != std::string::npos);
  CHECK(dump.find("disable_snapshot_annotations = false") != std::string::npos);
  CHECK(dump.find("[proxy_plugins.shoal]") != std::string::npos);
  std::tie(code, out) = Ctl(cleanup);
  CHECK(ReadFile(path) == minimal);

  // The operator's own [proxy_plugins.shoal] elsewhere: nothing is changed, and it says why.
  const std::string theirs =
      "version = 2\n[proxy_plugins.shoal]\n  type = \"snapshot\"\n"
      "  address = \"/var/run/other.sock\"\n";
  WriteFile(path, theirs);
  std::tie(code, out) = Ctl(args);
  CHECK(code == 1);
  CHECK(out.find("has its own [proxy_plugins.shoal] with type = \"snapshot\", address = "
                 "\"/var/run/other.sock\"") != std::string::npos);
  CHECK(ReadFile(path) == theirs);
  CHECK_FALSE(fs::exists(path + ".shoal-backup"));

  // A version 1 config (plugins named differently): left as it is.
  const std::string v1 = "[plugins.cri.containerd]\n  snapshotter = \"overlayfs\"\n";
  WriteFile(path, v1);
  std::tie(code, out) = Ctl(args);
  CHECK(code == 1);
  CHECK(out.find("it has no version = 2") != std::string::npos);
  CHECK(ReadFile(path) == v1);

  // containerd 2's version 3: left as it is, saying it is not supported yet and what prints the
  // settings to write by hand. That command, configured by its environment variables, prints
  // them with containerd 2's names (from its docs; no containerd 2 here to load them).
  const std::string v3 =
      "version = 3\n[plugins.'io.containerd.cri.v1.images']\n"
      "  snapshotter = \"overlayfs\"\n";
  WriteFile(path, v3);
  std::tie(code, out) = Ctl(args);
  CAPTURE(out);
  CHECK(code == 1);
  CHECK(out.find("/etc/containerd/config.toml: it is version 3 (containerd 2)") !=
        std::string::npos);
  CHECK(out.find("containerd 2 is not supported by them yet") != std::string::npos);
  const std::string hint =
      "`shoalctl config containerd --snapshotter --config-version 3 --snapshotter-socket "
      "/run/shoal/snapshotter.sock` prints them";
  CHECK(out.find(hint) != std::string::npos);
  CHECK(ReadFile(path) == v3);
  CHECK_FALSE(fs::exists(path + ".shoal-backup"));
  auto v3_settings = RunCommand(
      {SHOAL_CTL_BIN, "config", "containerd", "-o", host.Sub("certs.d")}, std::chrono::seconds(30),
      {"SHOAL_CONTAINERD_SNAPSHOTTER=true", "SHOAL_SNAPSHOTTER_SOCKET=/run/shoal/snapshotter.sock",
       "SHOAL_CONTAINERD_CONFIG_VERSION=3"});
  REQUIRE_MESSAGE(v3_settings.has_value(), Why(v3_settings));
  CAPTURE(v3_settings.value());
  const toml::table snippet = ParseToml(v3_settings.value());
  CHECK(snippet["proxy_plugins"]["shoal"]["type"].value<std::string>() == "snapshot");
  CHECK(snippet["proxy_plugins"]["shoal"]["address"].value<std::string>() ==
        "/run/shoal/snapshotter.sock");
  const auto images = snippet["plugins"]["io.containerd.cri.v1.images"];
  CHECK(images["snapshotter"].value<std::string>() == "shoal");
  CHECK(images["disable_snapshot_annotations"].value<bool>() == false);
  CHECK(snippet["plugins"].as_table()->size() == 1);
  CHECK(v3_settings.value().find("[plugins.\"io.containerd.cri.v1.images\".registry]") !=
        std::string::npos);  // where containerd 2 reads config_path
  // Bad input to it: a precise error, exit 2.
  std::tie(code, out) =
      Ctl({"config", "containerd", "--snapshotter", "--snapshotter-socket", "run/shoal.sock"});
  CHECK(code == 2);
  CHECK(out.find("--snapshotter-socket \"run/shoal.sock\" must be an absolute path") !=
        std::string::npos);
  std::tie(code, out) = Ctl({"config", "containerd", "--snapshotter", "--config-version", "4"});
  CHECK(code != 0);
  CHECK(out.find("--config-version: 4 not in {2,3}") != std::string::npos);

  // No config.toml: not created. Without --containerd-config: a usage error.
  fs::remove(path);
  std::tie(code, out) = Ctl(args);
  CHECK(code == 1);
  CHECK(out.find("does not exist: not created") != std::string::npos);
  CHECK_FALSE(fs::exists(path));
  std::tie(code, out) = Ctl({"node-setup", "--root", host.path(), "--containerd-snapshotter"});
  CHECK(code == 2);
  CHECK(out.find("--containerd-snapshotter needs --containerd-config") != std::string::npos);
}

TEST_CASE(
    "node-setup: the containerd snapshotter opt-in leaves a config.toml that is not TOML, or whose "
    "line edit would change more than shoal's settings, as it is and says where, and edits "
    "settings written as dotted keys") {
  TempDir host("shoal-host");
  const std::string node_path = "/etc/containerd/config.toml";
  const std::string path = host.Sub("etc/containerd/config.toml");
  fs::create_directories(host.Sub("etc/containerd"));
  const std::vector<std::string> args = {"node-setup", "--root",
                                         host.path(),  "--containerd-config",
                                         node_path,    "--containerd-snapshotter"};
  std::vector<std::string> cleanup = args;
  cleanup.insert(cleanup.begin() + 1, "--cleanup");
  int code = 0;
  std::string out;

  // Not TOML: toml++'s reason at file:line:column, nothing written.
  const std::string broken =
      "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \n";
  WriteFile(path, broken);
  std::tie(code, out) = Ctl(args);
  CAPTURE(out);
  CHECK(code == 1);
  CHECK(out.find(node_path + ":3:17: Error while parsing key-value pair") != std::string::npos);
  CHECK(out.find("left as it is") != std::string::npos);
  CHECK(ReadFile(path) == broken);
  CHECK_FALSE(fs::exists(path + ".shoal-backup"));

  // An edited file that the operator broke afterwards: cleanup takes nothing back.
  const std::string good = "version = 2\n";
  WriteFile(path, good);
  std::tie(code, out) = Ctl(args);
  REQUIRE(code == 0);
  const std::string edited_broken = ReadFile(path) + "oops = \n";
  WriteFile(path, edited_broken);
  const auto last_line = std::count(edited_broken.begin(), edited_broken.end(), '\n');
  std::tie(code, out) = Ctl(cleanup);
  CAPTURE(out);
  CHECK(code == 1);
  CHECK(out.find(node_path + ":" + std::to_string(last_line) + ":8: ") != std::string::npos);
  CHECK(ReadFile(path) == edited_broken);
  CHECK(fs::exists(path + ".shoal-backup"));
  fs::remove(path + ".shoal-backup");

  // The operator's own line ending in shoal's "added" marker (say, copied from an edited file):
  // taking shoal's lines back would drop it too. The line editor cannot tell; the parsed
  // result, compared with the original, can: refused both ways, nothing written.
  const std::string marked =
      "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n"
      "  config_path = \"/etc/containerd/certs.d\"  # shoal-node-setup: added\n";
  WriteFile(path, marked);
  for (const auto& a : {args, cleanup}) {
    std::tie(code, out) = Ctl(a);
    CAPTURE(out);
    CHECK(code == 1);
    CHECK(out.find(node_path + ": the line-level edit would also change plugins.\"io.containerd."
                               "grpc.v1.cri\".registry.config_path") != std::string::npos);
    CHECK(ReadFile(path) == marked);
    CHECK_FALSE(fs::exists(path + ".shoal-backup"));
  }

  // The CRI's settings as dotted keys of its plugin table: changed on their own lines, and
  // containerd reads them; cleanup gives the bytes back.
  const std::string dotted =
      "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n"
      "  containerd.snapshotter = \"overlayfs\"\n"
      "  containerd.disable_snapshot_annotations = true\n"
      "  registry.config_path = \"/etc/containerd/certs.d\"\n";
  WriteFile(path, dotted);
  std::tie(code, out) = Ctl(args);
  CAPTURE(out);
  CHECK(code == 0);
  const std::string edited = ReadFile(path);
  CAPTURE(edited);
  CHECK(edited.find("  containerd.snapshotter = \"shoal\"  # shoal-node-setup: was:   "
                    "containerd.snapshotter = \"overlayfs\"\n") != std::string::npos);
  std::string dump = ConfigDump(path);
  CHECK(dump.find("snapshotter = \"shoal\"") != std::string::npos);
  CHECK(dump.find("disable_snapshot_annotations = false") != std::string::npos);
  CHECK(dump.find("config_path = \"/etc/containerd/certs.d\"") != std::string::npos);
  std::tie(code, out) = Ctl(cleanup);
  CHECK(code == 0);
  CHECK(ReadFile(path) == dotted);
}

}  // namespace
}  // namespace shoal::testkit
