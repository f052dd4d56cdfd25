#pragma once
// Debian's docker-registry (distribution 2.8.2) on 127.0.0.1 with filesystem storage in a temp
// dir: the real upstream registry of integration tests, and pushing OCI layouts into it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "tests/support/image.h"
#include "tests/support/process.h"

namespace shoal::testkit {

// How to run a registry. Defaults: anonymous, read-write, random free port.
struct RegistryOptions {
  enum class Auth { kNone, kHtpasswd, kToken };
  Auth auth = Auth::kNone;
  // Credentials: checked by the registry (kHtpasswd) or by the token server (kToken); also
  // what PushImage sends when auth != kNone.
  std::string user = "alice";
  std::string password = "s3cret";
  // Non-empty: pull-through cache mode (`proxy: remoteurl:`) in front of this URL, e.g.
  // "http://127.0.0.1:5000". Such a registry refuses pushes.
  std::string proxy_remote_url;
  std::string proxy_username, proxy_password;  // credentials for the remote, if it needs them
  // For kToken (TokenServer::ForRegistry() fills them): realm URL, service, issuer and the path
  // of the PEM root certificate bundle the registry verifies token signatures with.
  std::string token_realm, token_service, token_issuer, token_rootcert;
  // 0: pick a free port. Non-zero: listen there (e.g. to restart on a known port).
  uint16_t port = 0;
};

// A running docker-registry. Not copyable; the destructor stops it and deletes its storage.
// Methods are not thread-safe.
class Registry {
 public:
  // Writes config.yml (storage in a fresh TempDir, delete enabled, log level info, health checks
  // off), starts the registry and waits until GET /v2/ answers. Retries with another port if
  // the chosen one turns out to be taken. Errors: kUnavailable with the log tail.
  static Result<std::unique_ptr<Registry>> Start(RegistryOptions options = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // "127.0.0.1:PORT".
  std::string HostPort() const;
  // "http://127.0.0.1:PORT".
  std::string Url() const;
  uint16_t port() const { return options_.port; }
  const RegistryOptions& options() const { return options_; }
  // "user:password" for skopeo --creds / --dest-creds; "" when auth is kNone.
  std::string Creds() const;
  // Where the filesystem driver keeps a blob's bytes:
  // <root>/docker/registry/v2/blobs/sha256/<xx>/<hex>/data. Tests may corrupt or delete it.
  std::string BlobDataPath(const Digest& digest) const;
  // The storage root directory (rootdirectory in config.yml).
  std::string StorageRoot() const;
  // The registry's stdout+stderr log.
  std::string LogPath() const;
  // Stops the process (SIGTERM, then SIGKILL); storage is kept until destruction. Idempotent.
  void Stop();
  // Starts it again on the same port with the same storage (after Stop(), to simulate an outage
  // that ends). Errors: kUnavailable with the log tail.
  Status Restart();
  // Whether the process is running.
  bool Running();
  // The docker-registry process's pid (for CPU figures); 0 when stopped.
  pid_t pid() const { return process_ ? process_->pid() : 0; }

 private:
  explicit Registry(RegistryOptions options);
  Status Launch();

  RegistryOptions options_;
  std::unique_ptr<TempDir> dir_;  // config.yml, htpasswd, storage/, registry.log
  std::unique_ptr<Process> process_;
};

// Pushes tag `tag` of the OCI layout at `layout_dir` to `<reg.HostPort()>/<dest_name>:<tag>`
// with `skopeo copy --all --preserve-digests` (credentials from reg's options when auth is on),
// then checks that the digest the registry reports equals the layout's manifest digest.
// Errors: kUnavailable with skopeo's output; kDigestMismatch if digests differ.
Status PushImage(const Registry& reg, const std::string& layout_dir, const std::string& tag,
                 const std::string& dest_name);
// Same, pushing under a different destination tag.
Status PushImage(const Registry& reg, const std::string& layout_dir, const std::string& tag,
                 const std::string& dest_name, const std::string& dest_tag);

// Builds an image of one gzip layer (four small files and one of `big` bytes, all from `seed`)
// into the layout at layout_dir, tag "1", and pushes it as dest_name:1. Errors: as BuildImage
// and PushImage.
Result<BuiltImage> PushOneLayerImage(const Registry& reg, const std::string& layout_dir,
                                     const std::string& dest_name, uint64_t big, uint64_t seed);

}  // namespace shoal::testkit
