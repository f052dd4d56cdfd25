#include "lib/oci/media_types.h"

namespace shoal::oci {

bool IsIndexType(std::string_view media_type) {
  return media_type == kDockerManifestList || media_type == kOciIndex;
}

bool IsSchema1Type(std::string_view media_type) {
  return media_type == kDockerSchema1 || media_type == kDockerSchema1Signed;
}

bool IsManifestType(std::string_view media_type) {
  return IsIndexType(media_type) || media_type == kDockerManifestV2 || media_type == kOciManifest ||
         IsSchema1Type(media_type);
}

std::string NormalizeMediaType(std::string_view value) {
  value = value.substr(0, value.find(';'));
  size_t begin = value.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  size_t end = value.find_last_not_of(" \t");
  std::string out(value.substr(begin, end - begin + 1));
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace shoal::oci
