#include "lib/extract/entry_path.h"

namespace shoal::extract {

Result<std::string> NormalizeEntryPath(std::string_view path, const PathLimits& limits) {
  auto bad = [](std::string reason) {
    return MakeError(ErrorCode::kInvalidArgument, std::move(reason));
  };
  if (path.empty()) return bad("empty path");
  if (path.size() > limits.max_path_bytes) {
    return bad("path longer than " + std::to_string(limits.max_path_bytes) + " bytes");
  }
  if (path.find('\0') != std::string_view::npos) return bad("NUL byte in path");
  if (path.front() == '/') return bad("absolute path");
  std::string out;
  out.reserve(path.size());
  size_t depth = 0;
  size_t i = 0;
  while (i < path.size()) {
    size_t slash = path.find('/', i);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view name = path.substr(i, slash - i);
    i = slash + 1;
    if (name.empty() || name == ".") continue;
    if (name == "..") return bad("'..' component");
    if (name.size() > limits.max_name_bytes) {
      return bad("path component longer than " + std::to_string(limits.max_name_bytes) +
                 " bytes");
    }
    if (++depth > limits.max_depth) {
      return bad("path deeper than " + std::to_string(limits.max_depth) + " components");
    }
    if (!out.empty()) out.push_back('/');
    out.append(name);
  }
  return out;
}

std::pair<std::string_view, std::string_view> SplitParent(std::string_view normalized) {
  size_t slash = normalized.rfind('/');
  if (slash == std::string_view::npos) return {std::string_view(), normalized};
  return {normalized.substr(0, slash), normalized.substr(slash + 1)};
}

}  // namespace shoal::extract
