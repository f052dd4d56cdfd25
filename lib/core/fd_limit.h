#pragma once
// The process's open-file limit (RLIMIT_NOFILE): servers that hold tens of thousands of
// connections raise the soft limit to the hard one at start.

#include <cstdint>

namespace shoal {

// Raises the soft RLIMIT_NOFILE to the hard limit (when the kernel allows) and returns the soft
// limit in force afterwards (0 if it cannot be read).
uint64_t RaiseFdLimit();

}  // namespace shoal
