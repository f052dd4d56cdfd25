#pragma once
// A client of containerd's snapshots API on a unix socket, for `shoalctl doctor`: asks a
// snapshotter what containerd would ask. The gRPC and protobuf types stay in client.cc.

#include <chrono>
#include <cstddef>
#include <string>

#include "lib/core/error.h"

namespace shoal::snapshotter {

// Calls the snapshots service's List (all snapshots, as `ctr snapshots ls` does) on the unix
// socket `socket_path` and reads the whole answer within `timeout`. Returns how many snapshots
// the snapshotter holds. Errors: kUnavailable naming the socket, with gRPC's code and message
// (nothing listening, a server that is not a snapshotter, the deadline).
Result<size_t> CountSnapshots(const std::string& socket_path, std::chrono::milliseconds timeout);

}  // namespace shoal::snapshotter
