#pragma once
// containerd's snapshots gRPC API (containerd.services.snapshots.v1.Snapshots) over a Store, on
// a unix socket: what containerd reaches as `[proxy_plugins.shoal] type = "snapshot"`. The
// gRPC and protobuf types stay in service.cc; the agent sees only this class.

#include <memory>
#include <string>

#include "lib/core/error.h"
#include "snapshotter/layer_prep.h"
#include "snapshotter/store.h"

namespace shoal::snapshotter {

// A running gRPC server (its own threads: gRPC's synchronous server) that answers every
// snapshots call from `store`. Store errors become the gRPC codes containerd's errdefs turn
// back into its errors: NotFound, AlreadyExists, FailedPrecondition, InvalidArgument (and
// Internal for a disk failure). Stop() and the destructor may be called from any one thread.
class Server {
 public:
  // Listens on the unix socket `socket_path` (its directory is created; a stale socket left by
  // an earlier run is replaced; the socket is made mode 0600) and starts serving. `store` must
  // outlive the server. Errors: kInvalidArgument (the path is taken by something that is not a
  // socket, or too long for a unix socket), kUnavailable (gRPC could not listen), kIo.
  // With `prep` (optional, outliving the server), an unpacker's Prepare of a layer is first
  // offered to it (layer_prep.h): a layer it prepared is answered AlreadyExists.
  static Result<std::unique_ptr<Server>> Start(Store& store, const std::string& socket_path,
                                               LayerPrep* prep = nullptr);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Stops accepting calls, gives calls in flight up to `grace` to finish (then cancels them),
  // and removes the socket. Idempotent.
  void Stop(std::chrono::milliseconds grace = std::chrono::seconds(5));

  const std::string& socket_path() const { return socket_path_; }

 private:
  struct Impl;
  Server(std::string socket_path, std::unique_ptr<Impl> impl);

  std::string socket_path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal::snapshotter
