#pragma once
// Quoting of untrusted text for error messages and logs.

#include <cstddef>
#include <string>
#include <string_view>

namespace shoal::oci {

// Returns text in double quotes with control, non-ASCII, quote and backslash bytes escaped as
// \xNN (or \" \\), cut after max_bytes input bytes with "..." appended. Safe for any input.
std::string Quote(std::string_view text, size_t max_bytes = 80);

// Like Quote without the surrounding quotes and with quotes left as they are: makes a message
// that may echo untrusted bytes (e.g. from Digest::Parse) printable ASCII on one line.
std::string Printable(std::string_view text, size_t max_bytes = 400);

}  // namespace shoal::oci
