#pragma once
// Media types of manifests, indexes, layers and configs (Docker and OCI), and helpers to compare
// them. Pure functions, thread-safe.

#include <string>
#include <string_view>

namespace shoal::oci {

// Manifests and indexes.
inline constexpr std::string_view kDockerManifestV2 =
    "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr std::string_view kDockerManifestList =
    "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kDockerSchema1 =
    "application/vnd.docker.distribution.manifest.v1+json";
inline constexpr std::string_view kDockerSchema1Signed =
    "application/vnd.docker.distribution.manifest.v1+prettyjws";

// Layers.
inline constexpr std::string_view kOciLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip";
inline constexpr std::string_view kOciLayerZstd = "application/vnd.oci.image.layer.v1.tar+zstd";
inline constexpr std::string_view kOciLayerTar = "application/vnd.oci.image.layer.v1.tar";
inline constexpr std::string_view kDockerLayerGzip =
    "application/vnd.docker.image.rootfs.diff.tar.gzip";
inline constexpr std::string_view kDockerForeignLayerGzip =
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";

// Configs and other blobs.
inline constexpr std::string_view kOciConfig = "application/vnd.oci.image.config.v1+json";
inline constexpr std::string_view kDockerConfig = "application/vnd.docker.container.image.v1+json";
inline constexpr std::string_view kOciEmpty = "application/vnd.oci.empty.v1+json";
inline constexpr std::string_view kOctetStream = "application/octet-stream";

// True for the two index types (Docker manifest list, OCI index). Exact, case-sensitive match
// of a type without parameters (pass it through NormalizeMediaType first if unsure).
bool IsIndexType(std::string_view media_type);

// True for any of the four modern manifest/index types or the two Docker schema1 types.
bool IsManifestType(std::string_view media_type);

// True for the two Docker schema1 types, which shoal recognises but does not parse.
bool IsSchema1Type(std::string_view media_type);

// A header value reduced to its bare type: parameters (";charset=...") dropped, surrounding
// spaces and tabs trimmed, ASCII lowercased. "Application/JSON; q=1" -> "application/json".
std::string NormalizeMediaType(std::string_view value);

}  // namespace shoal::oci
