#pragma once
// A client for the Kubernetes CRI image service that containerd's CRI plugin serves on its gRPC
// socket (Debian has no crictl): just PullImage, what the kubelet calls to pull.

#include <chrono>
#include <string>

#include "lib/core/error.h"

namespace shoal::testkit {

// runtime.v1.ImageService/PullImage of `image` (e.g. "gcr.io/proj/img:1") over the unix socket
// `socket`; returns the image ref containerd answers (the image ID, "sha256:<config>").
// Errors: kUnavailable with gRPC's status code and message.
Result<std::string> CriPullImage(const std::string& socket, const std::string& image,
                                 std::chrono::seconds timeout = std::chrono::seconds(180));

}  // namespace shoal::testkit
