#pragma once
// Standard base64 (RFC 4648, with padding) through OpenSSL.

#include <optional>
#include <string>
#include <string_view>

namespace shoal {

// Encodes any bytes.
std::string Base64Encode(std::string_view in);
// Decodes; whitespace is ignored. nullopt for empty input, a bad length or bad characters.
std::optional<std::string> Base64Decode(std::string_view in);

}  // namespace shoal
