// Fuzzes ParseAccept and Accepts: entries are bounded, bare, lowercase and stable when parsed
// again, and a client always accepts what it listed.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lib/oci/manifest.h"
#include "lib/oci/media_types.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal::oci;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view header(reinterpret_cast<const char*>(data), size);
  auto accept = ParseAccept(header);
  FUZZ_CHECK(accept.size() <= kMaxAcceptEntries);

  std::string joined;
  for (const auto& entry : accept) {
    FUZZ_CHECK(!entry.empty());
    FUZZ_CHECK(entry.find_first_of(",;") == std::string::npos);
    FUZZ_CHECK(entry.front() != ' ' && entry.front() != '\t');
    FUZZ_CHECK(entry.back() != ' ' && entry.back() != '\t');
    for (char c : entry) FUZZ_CHECK(!(c >= 'A' && c <= 'Z'));
    FUZZ_CHECK(NormalizeMediaType(entry) == entry);
    FUZZ_CHECK(Accepts(accept, entry));
    if (!joined.empty()) joined += ",";
    joined += entry;
  }
  FUZZ_CHECK(ParseAccept(joined) == accept);

  bool any = accept.empty();
  for (const auto& entry : accept) any = any || entry == "*/*";
  for (auto type : {kDockerManifestV2, kDockerManifestList, kOciManifest, kOciIndex}) {
    if (any) FUZZ_CHECK(Accepts(accept, type));
  }
  // The header itself used as a media type must not upset Accepts.
  (void)Accepts(accept, header);
  return 0;
}
