// Fuzzes NormalizeEntryPath and SplitParent, the gate every tar entry path and hard link target
// passes before the extractor touches the disk. The input is the raw path. An accepted path is
// relative, has no empty, "." or ".." component (so it can never climb out of the layer root),
// respects the limits, is a fixed point, and splits back into itself. Rejections are
// kInvalidArgument with a printable message that does not echo the input.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lib/extract/entry_path.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::extract;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view path(reinterpret_cast<const char*>(data), size);
  const PathLimits limits;
  auto r = NormalizeEntryPath(path, limits);
  if (!r) {
    FUZZ_CHECK(r.error().code == ErrorCode::kInvalidArgument);
    FUZZ_CHECK(fuzz::IsPrintable(r.error().message));
    FUZZ_CHECK(r.error().message.size() < 100);
    return 0;
  }
  const std::string& norm = r.value();
  FUZZ_CHECK(norm.size() <= path.size());
  FUZZ_CHECK(path.find('\0') == std::string_view::npos);
  FUZZ_CHECK(path.empty() || path.front() != '/');
  if (norm.empty()) return 0;  // the layer root ("." or "./")
  FUZZ_CHECK(norm.front() != '/' && norm.back() != '/');
  FUZZ_CHECK(norm.find("//") == std::string::npos);
  size_t depth = 0;
  for (size_t i = 0; i <= norm.size();) {
    size_t slash = norm.find('/', i);
    if (slash == std::string::npos) slash = norm.size();
    std::string_view comp = std::string_view(norm).substr(i, slash - i);
    FUZZ_CHECK(!comp.empty() && comp != "." && comp != "..");
    FUZZ_CHECK(comp.size() <= limits.max_name_bytes);
    ++depth;
    i = slash + 1;
  }
  FUZZ_CHECK(depth <= limits.max_depth);
  auto again = NormalizeEntryPath(norm, limits);
  FUZZ_CHECK(again && again.value() == norm);
  auto [parent, name] = SplitParent(norm);
  FUZZ_CHECK(!name.empty() && name.find('/') == std::string_view::npos);
  FUZZ_CHECK((parent.empty() ? std::string(name) : std::string(parent) + "/" + std::string(name)) ==
             norm);
  return 0;
}
