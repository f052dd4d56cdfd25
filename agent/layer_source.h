#pragma once
// The snapshotter's way into the agent's pull path (snapshotter/layer_prep.h): manifests and
// blobs through PullThrough (cache, swarm or upstream, with the tracker's leases), exactly as a
// runtime's pull through the shim gets them. Calls come from the snapshotter's threads and run
// as coroutines on the agent's network thread.

#include <atomic>

#include <boost/asio/io_context.hpp>

#include "agent/pull_through.h"
#include "lib/store/blob_store.h"
#include "snapshotter/layer_prep.h"

namespace shoal::agent {

class PullThroughLayerSource : public snapshotter::LayerSource {
 public:
  // All references must outlive this object.
  PullThroughLayerSource(boost::asio::io_context& ioc, PullThrough& backend,
                         store::BlobStore& store)
      : ioc_(ioc), backend_(backend), store_(store) {}

  // Errors: a bad reference (kInvalidArgument), an unserved registry (kRefused), a repository
  // served only to checked clients (kRefused), the pull path's, kUnavailable at the deadline,
  // kCancelled after Stop().
  Result<ManifestBody> Manifest(const std::string& image_ref, const Digest& digest,
                                snapshotter::Deadline deadline) override;
  // The path of the cached blob once it is complete. Errors: as Manifest.
  Result<std::string> Blob(const std::string& image_ref, const Digest& digest,
                           snapshotter::Deadline deadline) override;
  // A stream over PullThrough::OpenBlob's reader: reads wait (on the network thread) for the
  // bytes the fetch has made safe and pread them from its file. Errors: as Manifest.
  Result<std::unique_ptr<extract::ByteSource>> OpenBlob(const std::string& image_ref,
                                                        const Digest& digest,
                                                        snapshotter::Deadline deadline) override;
  // Calls in flight and later ones return kCancelled (the network thread is going away).
  void Stop() { stopped_ = true; }

 private:
  boost::asio::io_context& ioc_;
  PullThrough& backend_;
  store::BlobStore& store_;
  std::atomic<bool> stopped_{false};
};

}  // namespace shoal::agent
