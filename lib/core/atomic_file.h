#pragma once
// Small files replaced atomically: a crash leaves the old file or the new one, never a part.

#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal {

// Writes `content` to `tmp_path` (created exclusively with `mode`), fsyncs it and renames it
// over `path`, then fsyncs path's directory. The temp file is removed on failure. tmp_path must
// be on path's file system and unique to this call. Errors: kIo naming the step and the path.
Status WriteFileAtomic(const std::string& tmp_path, const std::string& path,
                       std::string_view content, unsigned mode = 0644);

// fsyncs the directory `dir` (after a rename or unlink in it). Errors: kIo naming it.
Status FsyncDir(const std::string& dir);

}  // namespace shoal
