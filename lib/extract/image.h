#pragma once
// An image's layers extracted into docker's overlay2 layout, all layers at once:
//
//   <root>/<id>/diff/     the layer's files (layer.h)
//   <root>/<id>/link      the layer's short name, e.g. "9F86D081884C7D659A2FEAA0C5"
//   <root>/<id>/lower     non-base layers: the lower chain, nearest first, "l/<short>:l/<short>"
//   <root>/<id>/work/     non-base layers: overlayfs's workdir when the layer is mounted as upper
//   <root>/l/<short>      symlink to ../<id>/diff (keeps mount options short)
//
// The id of a layer names the layer and everything below it (a chain id over blob digests):
// id(0) = hex of the base layer's blob digest; id(i) = sha256(id(i-1) + " " + digest(i)). A layer
// whose <root>/<id> already exists is complete (it is only ever created by a rename) and is
// reused. Each layer has its own diff dir, so all are extracted in parallel.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"
#include "lib/extract/byte_source.h"
#include "lib/extract/layer.h"

namespace shoal::extract {

// One layer to extract, bottom first in the image's order.
struct LayerInput {
  Digest digest;                // the blob digest (checked while extracting if `verify`)
  uint64_t size_hint = 0;       // compressed size; larger layers are started first
  // Opens the layer's bytes; called once, on the worker thread that extracts it.
  std::function<Result<std::unique_ptr<ByteSource>>()> open;
  bool verify = true;           // hash the bytes and refuse a mismatch before committing
};

// Settings for ExtractImage.
struct ImageExtractOptions {
  ExtractOptions layer;   // expected_digest is set per layer from LayerInput when verify
  // Worker threads; 0 = one per CPU core. Never more than the number of layers.
  unsigned parallelism = 0;
  // Called on a worker thread when a layer ends (ok or not); must be thread-safe.
  std::function<void(size_t index, const Result<LayerStats>&)> on_layer_done;
};

// What one layer became.
struct LayerResult {
  std::string id;         // directory name under root
  std::string short_id;   // name of its l/ symlink
  std::string diff_dir;   // <root>/<id>/diff
  bool reused = false;    // it was already there; nothing was read
  LayerStats stats;       // zero when reused
};

// The overlay2 ids of an image's layers (see the file comment), bottom first.
std::vector<std::string> LayerChainIds(const std::vector<Digest>& digests);

// Extracts every layer into the overlay2 layout under `root` (created if missing), layers in
// parallel. Blocking. Results are in `layers` order. On failure the first failed layer's
// error (in `layers` order) is returned, prefixed with its index and digest; the layers that
// did succeed stay (they are complete) and the failed ones leave nothing.
Result<std::vector<LayerResult>> ExtractImage(const std::string& root,
                                              std::vector<LayerInput> layers,
                                              const ImageExtractOptions& options = {});

// The overlayfs lowerdir value for mounting the image read-only: every diff dir, top first,
// absolute paths joined with ':'.
std::string LowerDirOption(const std::vector<LayerResult>& layers);

}  // namespace shoal::extract
