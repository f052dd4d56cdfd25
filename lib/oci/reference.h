#pragma once
// Repository names, tags, manifest references and full image references, validated and
// normalised the way the distribution spec and docker do it. Pure functions, thread-safe.

#include <optional>
#include <string>
#include <string_view>

#include "lib/core/digest.h"
#include "lib/core/error.h"

namespace shoal::oci {

// Longest repository name the distribution spec allows, in bytes.
inline constexpr size_t kMaxNameLength = 255;
// The registry docker uses for names without a host; the index/registry-1 aliases map to it.
inline constexpr std::string_view kDockerHub = "docker.io";

// Checks a repository name: components [a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)* joined by "/",
// at most 255 bytes. kInvalidArgument says which component is wrong and why.
Status ValidateName(std::string_view name);

// Checks a tag: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}. kInvalidArgument with the reason.
Status ValidateTag(std::string_view tag);

// Checks a registry host as it appears in an image reference: DNS labels or an IPv4 address
// ([A-Za-z0-9] with inner "-", joined by "."), or "[IPv6]", optionally ":port" (1-65535).
Status ValidateRegistryHost(std::string_view host);

// True if the first path component of a name is a registry host rather than part of the
// repository: it contains "." or ":" or equals "localhost" (docker's rule).
bool LooksLikeRegistryHost(std::string_view component);

// Maps docker's aliases "index.docker.io" and "registry-1.docker.io" to "docker.io"; returns
// any other host unchanged.
std::string NormalizeRegistryHost(std::string_view host);

// The <reference> of /v2/<name>/manifests/<reference>: either a tag or a digest.
struct ManifestRef {
  std::string tag;               // empty when this is a digest reference
  std::optional<Digest> digest;  // set when this is a digest reference

  // True when the reference is a digest.
  bool IsDigest() const { return digest.has_value(); }
  // The reference as it appears in a URL: "sha256:<hex>" or the tag.
  std::string str() const;
};

// Parses a manifest reference: text containing ":" is a digest (errors from Digest::Parse
// propagate: kInvalidArgument or kUnsupported), anything else must be a valid tag.
Result<ManifestRef> ParseManifestRef(std::string_view ref);

// A fully normalised image reference, e.g. docker.io/library/busybox:latest.
struct ImageRef {
  std::string registry;          // host[:port], docker aliases normalised to "docker.io"
  std::string repository;        // validated name, "library/" added for docker.io singletons
  std::string tag;               // "latest" if neither tag nor digest was given; may be empty
  std::optional<Digest> digest;  // set for name@sha256:... references

  // The canonical text: registry/repository[:tag][@digest].
  std::string str() const;
  // What goes into /v2/<repository>/manifests/<ref>: the digest if set, else the tag.
  std::string RefString() const;
};

// Parses an image reference with docker's normalisation: "busybox" becomes
// docker.io/library/busybox:latest; "127.0.0.1:5000/a/b@sha256:..." keeps its host. The first
// component is a host iff LooksLikeRegistryHost. Errors (kInvalidArgument, or kUnsupported for
// a digest of an algorithm other than sha256/sha512) name the part that is wrong; uppercase in
// the repository is an error.
Result<ImageRef> ParseImageRef(std::string_view text);

// A repository name split into the registry it names and the repository within it.
struct SplitName {
  std::string registry;    // normalised with NormalizeRegistryHost
  std::string repository;  // not validated; "library/" added for single-component docker.io
};

// For the shim's name-prefix mode (/v2/gcr.io/proj/img/...): if the first component of a raw
// name looks like a syntactically valid registry host, returns it split off
// ("gcr.io/proj/img" -> gcr.io + proj/img; "docker.io/busybox" -> docker.io + library/busybox).
// Otherwise nullopt. Call it before ValidateName: hosts may contain ":port".
std::optional<SplitName> SplitRegistryPrefix(std::string_view name);

}  // namespace shoal::oci
