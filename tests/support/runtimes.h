#pragma once
// Real container runtimes for integration tests, each isolated in a temp dir: Debian's dockerd
// (with the 20.10 docker client), containerd with ctr, and podman. Nothing they do touches the
// host's own daemons, stores or credentials (see ../shared/reference/runtimes.md).

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/error.h"
#include "tests/support/process.h"

namespace shoal::testkit {

// A dockerd with its own data-root, exec-root, pidfile and unix socket under a TempDir, the vfs
// storage driver, no iptables and no bridge. Not thread-safe; the destructor stops it (SIGTERM,
// then SIGKILL to its process group) and unmounts the data-root bind mount it leaves behind.
class Dockerd {
 public:
  // Writes daemon.json = `settings` (a JSON object, e.g. the output of `shoalctl config
  // dockerd`) with the isolation settings above forced over it, starts dockerd with extra_env
  // ("NAME=value", e.g. HTTPS_PROXY) and waits up to 60 s until `docker version` answers.
  // Errors: kUnavailable naming what failed, with the log tail.
  static Result<std::unique_ptr<Dockerd>> Start(const std::string& settings = "{}",
                                                std::vector<std::string> extra_env = {});
  ~Dockerd();
  Dockerd(const Dockerd&) = delete;
  Dockerd& operator=(const Dockerd&) = delete;

  // Runs the Debian docker client (/usr/bin/docker, API 1.41) against this daemon with a
  // DOCKER_CONFIG of its own (see WriteClientConfig). Returns its output. Errors: as RunCommand.
  Result<std::string> Docker(std::vector<std::string> args,
                             std::chrono::seconds timeout = std::chrono::seconds(180));
  // Writes the client's config.json (e.g. Docker Hub credentials to check they go nowhere).
  void WriteClientConfig(const std::string& json);
  // The manifest digest dockerd recorded for a pulled image ("sha256:..."), from RepoDigests.
  // Errors: kNotFound if the image has no repo digest.
  Result<std::string> RepoDigest(const std::string& image);
  // The end of dockerd's log, and all of it.
  std::string LogTail() const;
  std::string Log() const { return process_ ? process_->Log() : ""; }
  // The daemon.json it runs with, its pid file and its pid (SIGHUP reloads must keep it).
  std::string DaemonJsonPath() const { return dir_->Sub("daemon.json"); }
  std::string PidFilePath() const { return dir_->Sub("docker.pid"); }
  pid_t Pid() const { return process_ ? process_->pid() : -1; }

 private:
  Dockerd() : dir_(std::make_unique<TempDir>("shoal-dockerd")) {}
  void Shutdown();

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Process> process_;
};

// A containerd with root, state and its sockets under a TempDir, the CRI plugin disabled.
// Not thread-safe; the destructor stops it.
class Containerd {
 public:
  // Starts it and waits up to 30 s for `ctr version`. `extra_config` is TOML appended to its
  // config.toml (version 2), e.g. a `[proxy_plugins.NAME]` section for a snapshotter. Errors:
  // kUnavailable with the log tail.
  // With `cri`, its CRI plugin runs too (on the same socket, namespace k8s.io), with what it
  // needs to start here: CNI directories of its own (empty: image service only, no pod
  // networks), no TCP or TLS streaming, no AppArmor or SELinux. Add CriImageConfig to choose
  // its snapshotter and registry hosts.
  // `before_start`, if given, is called with the path of the config.toml once it is written
  // and before containerd starts (e.g. to let `shoalctl node-setup` edit it).
  static Result<std::unique_ptr<Containerd>> Start(
      const std::string& extra_config = "", bool cri = false,
      const std::function<void(const std::string& config_path)>& before_start = {});
  // The TOML for the CRI plugin's image pulls: snapshotter `snapshotter` with snapshot
  // annotations on (the labels remote snapshotters read), registry hosts from `hosts_dir`
  // (hosts.toml per registry, as `shoalctl config containerd` writes).
  static std::string CriImageConfig(const std::string& snapshotter, const std::string& hosts_dir);
  // containerd's gRPC socket (the CRI's too).
  std::string Socket() const { return dir_->Sub("containerd.sock"); }
  // The TOML for a proxy snapshotter plugin `name` served on the unix socket `socket_path`
  // (containerd then accepts `--snapshotter name`).
  static std::string ProxySnapshotterConfig(const std::string& name,
                                            const std::string& socket_path);
  ~Containerd();
  Containerd(const Containerd&) = delete;
  Containerd& operator=(const Containerd&) = delete;

  // Runs `ctr --address SOCK <args>`. Errors: as RunCommand.
  Result<std::string> Ctr(std::vector<std::string> args,
                          std::chrono::seconds timeout = std::chrono::seconds(180));
  // `ctr images pull --snapshotter <snapshotter> --hosts-dir hosts_dir <ref>` (no --plain-http:
  // the scheme comes from hosts.toml, and a fallback to the real registry fails without
  // internet). The default, native, needs no mounts per layer.
  Result<std::string> Pull(const std::string& hosts_dir, const std::string& ref,
                           const std::string& snapshotter = "native");
  // The manifest (or index) digest of an image in containerd's store. Errors: kNotFound.
  Result<std::string> ImageDigest(const std::string& ref);
  std::string LogTail() const;
  // The config.toml it runs with.
  std::string ConfigPath() const { return dir_->Sub("config.toml"); }
  // containerd's pid (for CPU figures); -1 when not started.
  pid_t Pid() const { return process_ ? process_->pid() : -1; }

 private:
  Containerd() : dir_(std::make_unique<TempDir>("shoal-containerd")) {}

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Process> process_;
};

// podman with its storage (vfs), run root, tmp dir, auth file, containers.conf, storage.conf
// and signature policy under a TempDir. Each call is a separate podman process (no daemon).
class Podman {
 public:
  Podman() : dir_(std::make_unique<TempDir>("shoal-podman")) {}
  // Runs `podman <isolation flags> <args>` with CONTAINERS_REGISTRIES_CONF=registries_conf.
  // Errors: as RunCommand.
  Result<std::string> Run(const std::string& registries_conf, std::vector<std::string> args,
                          std::chrono::seconds timeout = std::chrono::seconds(180));
  // `podman pull` with a signature policy that accepts anything (images here are unsigned).
  Result<std::string> Pull(const std::string& registries_conf, const std::string& ref);
  // The manifest digest podman recorded for a pulled image. Errors: kNotFound.
  Result<std::string> ImageDigest(const std::string& registries_conf, const std::string& ref);

 private:
  std::unique_ptr<TempDir> dir_;
};

// Runs `shoalctl <args>` (the built binary) and returns its output. Errors: as RunCommand.
Result<std::string> Shoalctl(std::vector<std::string> args);

}  // namespace shoal::testkit
