// Fuzzes ParseManifest with the body alone and with a Content-Type chosen from the input's
// size: accepted manifests are internally consistent, rejections are clean and printable.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lib/oci/manifest.h"
#include "lib/oci/media_types.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::oci;

namespace {

constexpr std::string_view kContentTypes[] = {
    "",
    kDockerManifestV2,
    kDockerManifestList,
    kOciManifest,
    kOciIndex,
    kDockerSchema1Signed,
    "application/json",
    "Application/VND.OCI.Image.Index.v1+json; charset=utf-8",
};

void CheckDescriptor(const Descriptor& d) {
  FUZZ_CHECK(!d.media_type.empty());
  FUZZ_CHECK(d.size >= 0);
  FUZZ_CHECK(d.digest.hex().size() == 64);
}

void Check(const Result<Manifest>& result, std::string_view content_type) {
  if (!result) {
    const Error& e = result.error();
    FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kUnsupported);
    FUZZ_CHECK(std::string_view(e.message).starts_with("manifest "));
    FUZZ_CHECK(fuzz::IsPrintable(e.message));
    return;
  }
  const Manifest& m = result.value();
  FUZZ_CHECK(IsManifestType(m.media_type) && !IsSchema1Type(m.media_type));
  FUZZ_CHECK(m.is_index == IsIndexType(m.media_type));
  std::string served = NormalizeMediaType(content_type);
  if (IsManifestType(served)) FUZZ_CHECK(m.media_type == served);
  if (m.is_index) {
    FUZZ_CHECK(!m.config.has_value() && m.layers.empty());
  } else {
    FUZZ_CHECK(m.config.has_value() && m.manifests.empty());
    CheckDescriptor(*m.config);
  }
  FUZZ_CHECK(m.layers.size() <= kMaxDescriptors && m.manifests.size() <= kMaxDescriptors);
  for (const auto& d : m.layers) CheckDescriptor(d);
  for (const auto& d : m.manifests) CheckDescriptor(d);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  Check(ParseManifest(body, ""), "");
  std::string_view content_type = kContentTypes[size % std::size(kContentTypes)];
  if (!content_type.empty()) Check(ParseManifest(body, content_type), content_type);
  return 0;
}
