#pragma once
// Validation of tar entry paths (and hard link targets) before anything touches the disk.
// Pure functions, thread-safe; this is the parser the extract_path fuzz target exercises.

#include <cstddef>
#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal::extract {

// Bounds on one path; the defaults are far above anything a real image holds.
struct PathLimits {
  size_t max_path_bytes = 4096;     // whole path, as in the tar entry (PATH_MAX)
  size_t max_name_bytes = 255;      // one component (NAME_MAX)
  size_t max_depth = 128;           // components
};

// Normalizes a tar entry path to "a/b/c": drops "." components, repeated and trailing slashes
// and a leading "./"; returns "" for the layer root ("." or "./"). Errors (kInvalidArgument,
// message naming the reason, not the path): empty path, NUL byte, absolute path, a ".."
// component, a too long path or component, too deep.
Result<std::string> NormalizeEntryPath(std::string_view path, const PathLimits& limits = {});

// Splits a normalized path into (parent, name): "a/b/c" -> ("a/b", "c"), "c" -> ("", "c").
// `normalized` must be non-empty.
std::pair<std::string_view, std::string_view> SplitParent(std::string_view normalized);

}  // namespace shoal::extract
