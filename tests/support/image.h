#pragma once
// Generated OCI images: deterministic layers written straight into an OCI image layout
// (oci-layout, index.json, blobs/sha256/...), plus helpers to pull and verify layouts.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"

namespace shoal::testkit {

// Layer compression, i.e. its media type (tar, tar+gzip, tar+zstd).
enum class Compression { kNone, kGzip, kZstd };

// "sha256:000...0": the value of Digest fields that are unset (Digest has no default).
inline Digest NullDigest() { return Digest::FromSha256Hex(std::string(64, '0')); }

// One layer's content. The same spec always yields the same bytes (and digest).
struct LayerSpec {
  Compression compression = Compression::kGzip;
  // Small files of a few hundred bytes .. 64 KiB each, spread over nested directories.
  int small_files = 20;
  // Sizes of large files; pseudo-random content with every other 32 KiB block zero, so that it
  // compresses about 2x quickly.
  std::vector<uint64_t> big_files;
  // Varies all content and names; layers with different seeds differ.
  uint64_t seed = 1;
  // Adds a whiteout file (".wh.<name>") and an opaque directory marker (".wh..wh..opq").
  bool with_whiteout = false;
  // Adds a symlink and a hard link to one of the small files.
  bool with_symlink_and_hardlink = true;
};

// A single-platform image.
struct ImageSpec {
  std::vector<LayerSpec> layers;
  std::string os = "linux";
  std::string architecture = "amd64";
};

// What BuildImage/BuildIndex wrote. For an index, manifest_* describe the index itself and
// layer_digests/layer_sizes/total_blob_bytes cover all platforms' blobs (config + layers, not
// the platform manifests); per-platform details are in `platforms`.
struct BuiltImage {
  std::string layout_dir;
  std::string tag;
  Digest manifest_digest = NullDigest();
  std::string manifest_json;            // exact bytes of the manifest (or index) blob
  std::string media_type;               // of the manifest (or index)
  Digest config_digest = NullDigest();  // for an index: the first platform's config
  std::vector<Digest> layer_digests;
  std::vector<uint64_t> layer_sizes;  // compressed sizes, parallel to layer_digests
  std::vector<Digest> diff_ids;       // sha256 of each uncompressed tar
  uint64_t total_blob_bytes = 0;      // config + layers
  std::vector<BuiltImage> platforms;  // only for BuildIndex
};

// Writes the image's blobs into the OCI layout at `layout_dir` (created if missing; an existing
// layout keeps its other tags, and `tag` is replaced) and tags it. Streams: memory use does not
// grow with layer size. Errors: kIo naming the path, kInternal on compressor errors.
Result<BuiltImage> BuildImage(const ImageSpec& spec, const std::string& layout_dir,
                              const std::string& tag);

// Writes one image per spec (e.g. linux/amd64 and linux/arm64, with different layer seeds) and
// an OCI image index over them, tagged `tag`. The platform manifests are not tagged.
Result<BuiltImage> BuildIndex(const std::vector<ImageSpec>& platforms,
                              const std::string& layout_dir, const std::string& tag);

// Two small platform images (linux/amd64, linux/arm64) with distinct content, for BuildIndex.
std::vector<ImageSpec> DefaultMultiArchSpecs();

// What an OCI layout holds under one tag.
struct LayoutImage {
  Digest manifest_digest = NullDigest();
  std::string media_type;
  std::string manifest_json;
  // For an image manifest: its config and layers. For an index: NullDigest() and empty.
  Digest config_digest = NullDigest();
  std::vector<Digest> layer_digests;
  // For an index: the platform manifests' digests.
  std::vector<Digest> child_manifests;
};

// Reads the tag's entry in index.json and the manifest blob it points to. Errors: kNotFound if
// the tag is absent, kIo / kProtocol for unreadable or malformed files.
Result<LayoutImage> ReadLayout(const std::string& layout_dir, const std::string& tag);

// Re-hashes every file under <layout_dir>/blobs/sha256 and checks it matches its name. Returns
// the sorted digests. Errors: kDigestMismatch naming the first bad blob, kIo.
Result<std::vector<Digest>> LayoutBlobDigests(const std::string& layout_dir);

// Runs `skopeo --insecure-policy <args>` isolated from the host's configuration (an empty
// registries.conf and auth file of its own, so no mirrors or stored credentials apply) and
// returns its output. `extra_env` entries ("NAME=value") override those, e.g.
// "CONTAINERS_REGISTRIES_CONF=/path/with/mirrors.conf". Errors: as RunCommand.
Result<std::string> Skopeo(std::vector<std::string> args,
                           std::chrono::seconds timeout = std::chrono::seconds(600),
                           std::vector<std::string> extra_env = {});

// Runs `skopeo copy --all --src-tls-verify=false --preserve-digests
// --dest-oci-accept-uncompressed-layers <extra_args> docker://<src_docker_ref> oci:<out_dir>:<tag>`
// (src_docker_ref like "127.0.0.1:5000/demo/app:1"), verifies every blob in out_dir with
// LayoutBlobDigests and returns ReadLayout(out_dir, tag). Use a fresh out_dir per pull: skopeo
// skips blobs already in the layout. Put "--src-creds", "u:p" in
// extra_args for an authenticated source. Errors: kUnavailable with skopeo's output,
// kDigestMismatch.
Result<LayoutImage> SkopeoCopyToLayout(const std::string& src_docker_ref,
                                       const std::string& out_dir,
                                       std::vector<std::string> extra_args = {},
                                       const std::string& tag = "pulled");

}  // namespace shoal::testkit
