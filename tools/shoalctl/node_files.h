#pragma once
// Reading and writing a node's files for node-setup and doctor: paths under a root prefix
// (/host in the DaemonSet, a fixture tree in tests) and atomic, idempotent writes.

#include <optional>
#include <string>

#include "lib/core/error.h"

namespace shoal::ctl {

// root + path ("/host" + "/etc/docker/daemon.json"); root "" or "/" leaves path alone.
std::string UnderRoot(const std::string& root, const std::string& path);
// The whole file, or nullopt when it does not exist. Errors: kIo for other failures.
Result<std::optional<std::string>> ReadIfExists(const std::string& path);
// What WriteAtomic did.
enum class WriteOutcome { kUnchanged, kCreated, kReplaced };
// Writes content to path unless it already holds exactly that: a temp file in the same
// directory, fsync, rename over path, fsync of the directory. Keeps an existing file's mode and
// owner; new files get `mode`. Creates missing parent directories. Errors: kIo naming the path.
Result<WriteOutcome> WriteAtomic(const std::string& path, const std::string& content,
                                 unsigned mode = 0644);
// Removes path; a missing file is no error. Errors: kIo.
Status RemoveIfExists(const std::string& path);

}  // namespace shoal::ctl
