// Fuzzes ParseImageRef and SplitRegistryPrefix: any accepted reference is fully valid and its
// canonical text parses back to the same reference.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lib/oci/reference.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::oci;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);

  auto ref = ParseImageRef(text);
  if (ref) {
    const ImageRef& r = ref.value();
    FUZZ_CHECK(ValidateRegistryHost(r.registry));
    FUZZ_CHECK(LooksLikeRegistryHost(r.registry));
    FUZZ_CHECK(ValidateName(r.repository));
    FUZZ_CHECK(!r.tag.empty() || r.digest.has_value());
    if (!r.tag.empty()) FUZZ_CHECK(ValidateTag(r.tag));
    FUZZ_CHECK(r.RefString() == (r.digest ? r.digest->str() : r.tag));
    if (r.registry == kDockerHub) FUZZ_CHECK(r.repository.find('/') != std::string::npos);

    auto again = ParseImageRef(r.str());
    FUZZ_CHECK(again);
    FUZZ_CHECK(again.value().registry == r.registry);
    FUZZ_CHECK(again.value().repository == r.repository);
    FUZZ_CHECK(again.value().tag == r.tag);
    FUZZ_CHECK(again.value().digest == r.digest);
    FUZZ_CHECK(again.value().str() == r.str());
  } else {
    const Error& e = ref.error();
    FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kUnsupported);
    FUZZ_CHECK(!e.message.empty());
    FUZZ_CHECK(fuzz::IsPrintable(e.message));
  }

  if (auto split = SplitRegistryPrefix(text)) {
    FUZZ_CHECK(ValidateRegistryHost(split->registry));
    FUZZ_CHECK(LooksLikeRegistryHost(split->registry));
    FUZZ_CHECK(split->repository.size() <= text.size() + 8);
  } else if (size_t slash = text.find('/'); slash != std::string_view::npos) {
    std::string_view first = text.substr(0, slash);
    FUZZ_CHECK(!LooksLikeRegistryHost(first) || !ValidateRegistryHost(first));
  }
  return 0;
}
