// Fuzzes what the shim parses from /v2/<name>/manifests/<ref>: ParseManifestRef, ValidateName
// and ValidateTag. Accepted values round-trip and satisfy the distribution-spec grammar.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lib/oci/reference.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::oci;

namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
         c == '/';
}

void CheckError(const Error& e) {
  FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kUnsupported);
  FUZZ_CHECK(!e.message.empty());
  FUZZ_CHECK(fuzz::IsPrintable(e.message));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);

  auto ref = ParseManifestRef(text);
  if (ref) {
    FUZZ_CHECK(ref.value().str() == text);
    FUZZ_CHECK(ref.value().IsDigest() == (text.find(':') != std::string_view::npos));
    FUZZ_CHECK(ref.value().IsDigest() == ref.value().tag.empty());
  } else {
    CheckError(ref.error());
  }

  auto name = ValidateName(text);
  if (name) {
    FUZZ_CHECK(!text.empty() && text.size() <= kMaxNameLength);
    for (char c : text) FUZZ_CHECK(IsNameChar(c));
    FUZZ_CHECK(text.front() != '/' && text.back() != '/');
    FUZZ_CHECK(text.find("//") == std::string_view::npos);
  } else {
    CheckError(name.error());
  }

  auto tag = ValidateTag(text);
  if (tag) {
    FUZZ_CHECK(!text.empty() && text.size() <= 128);
    FUZZ_CHECK(text.front() != '.' && text.front() != '-');
  } else {
    CheckError(tag.error());
  }

  // A name the shim receives may carry a registry prefix; once split, the rest is what gets
  // validated, and a valid full name never has a ":port" host split off.
  if (auto split = SplitRegistryPrefix(text)) {
    FUZZ_CHECK(ValidateRegistryHost(split->registry));
    if (name) FUZZ_CHECK(split->registry.find(':') == std::string::npos);
    (void)ValidateName(split->repository);
  }
  return 0;
}
