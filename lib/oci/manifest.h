#pragma once
// Image manifests and indexes (Docker schema2, Docker manifest list, OCI manifest, OCI index)
// parsed from untrusted JSON, and the Accept header logic that picks which type a client gets.
// Pure functions, thread-safe.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/digest.h"
#include "lib/core/error.h"

namespace shoal::oci {

// Largest manifest body shoal accepts, in bytes (distribution's own limit is 4 MiB too).
inline constexpr size_t kMaxManifestBytes = 4 * 1024 * 1024;
// Most descriptors (layers or manifests) one manifest may list.
inline constexpr size_t kMaxDescriptors = 10'000;
// Deepest JSON nesting accepted; real manifests nest about 4 levels.
inline constexpr size_t kMaxJsonDepth = 64;
// Most Accept entries ParseAccept keeps.
inline constexpr size_t kMaxAcceptEntries = 64;

// The platform an index entry is built for (os "linux", architecture "arm64", variant "v8").
struct Platform {
  std::string os;
  std::string architecture;
  std::string variant;  // empty when absent
};

// A reference to a blob or manifest by digest.
struct Descriptor {
  std::string media_type;
  Digest digest;
  int64_t size = 0;                  // >= 0
  std::optional<Platform> platform;  // only on index entries, when present
};

// A parsed manifest or index. For an image manifest, config is set and layers lists the layers
// in order (bottom first); for an index, manifests lists the per-platform manifests.
struct Manifest {
  std::string media_type;  // one of the four modern manifest types
  bool is_index = false;
  std::optional<Descriptor> config;
  std::vector<Descriptor> layers;
  std::vector<Descriptor> manifests;
};

// Parses a schemaVersion 2 manifest or index. media_type comes from the body's "mediaType";
// if absent, from content_type when that names a manifest type; else inferred ("manifests" ->
// OCI index, "config"+"layers" -> OCI manifest). A content_type naming a manifest type must
// agree with the body. Errors are kInvalidArgument with the reason (kUnsupported for a
// descriptor digest of another algorithm than sha256 or sha512); work is bounded by the limits
// above.
Result<Manifest> ParseManifest(std::string_view body, std::string_view content_type);

// Splits Accept header values (several headers may be joined with ",") into bare lowercase
// media types, parameters such as ";q=0.5" dropped, empty entries skipped; keeps at most
// kMaxAcceptEntries.
std::vector<std::string> ParseAccept(std::string_view header);

// True if a client whose ParseAccept list is accept takes media_type: the list is empty, or
// holds "*/*", "application/*" (for application/ types) or the type itself.
bool Accepts(const std::vector<std::string>& accept, std::string_view media_type);

// What a client gets for a stored manifest, decided as docker-registry (distribution 2.8) does.
struct Negotiation {
  enum class Kind {
    kServe,   // the manifest as it is
    kChild,   // the manifest `child` instead (a list's linux/amd64 image, by tag only)
    kRefuse,  // 404 MANIFEST_UNKNOWN, `reason` saying why
  };
  Kind kind = Kind::kServe;
  std::optional<Digest> child;
  std::string reason;
};

// Negotiates a manifest of media_type (body: its bytes) for a client whose ParseAccept list is
// accept; by_tag: the reference was a tag. In order: a type the client accepts is served; a
// Docker manifest list asked for by tag by a client that names the Docker schema2 type (but not
// the list) gets the list's first linux/amd64 manifest (refused when there is none); a Docker
// type (schema2, list) asked for by digest is served whatever the Accept, since nothing else
// has that digest; anything else (OCI manifests and indexes, schema2 by tag) is refused. OCI
// indexes are never rewritten to a child.
Negotiation NegotiateManifest(const std::vector<std::string>& accept, std::string_view media_type,
                              std::string_view body, bool by_tag);

// The Accept value sent upstream for manifests: Docker v2, Docker list, OCI manifest and OCI
// index, comma separated.
std::string UpstreamManifestAccept();

}  // namespace shoal::oci
