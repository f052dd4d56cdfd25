#include "lib/oci/reference.h"

#include <arpa/inet.h>

#include <algorithm>

#include "lib/oci/quote.h"

namespace shoal::oci {
namespace {

// Image references longer than this cannot be valid (255-byte name, host, tag, digest); reject
// them before doing any work.
constexpr size_t kMaxImageRefLength = 1024;
constexpr size_t kMaxTagLength = 128;
constexpr size_t kMaxHostLength = 255;

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

std::string Char(char c) { return Quote(std::string_view(&c, 1)); }

// Why one path component of a repository name is invalid, or nullopt if it is valid.
std::optional<std::string> ComponentProblem(std::string_view c) {
  if (c.empty()) return "is empty (leading, trailing or doubled \"/\")";
  for (char ch : c) {
    if (ch >= 'A' && ch <= 'Z') return "contains uppercase " + Char(ch) + " (names are lowercase)";
    if (!IsLowerAlnum(ch) && ch != '.' && ch != '_' && ch != '-') {
      return "contains invalid character " + Char(ch);
    }
  }
  if (!IsLowerAlnum(c.front())) return "starts with separator " + Char(c.front());
  if (!IsLowerAlnum(c.back())) return "ends with separator " + Char(c.back());
  for (size_t i = 0; i < c.size();) {
    if (IsLowerAlnum(c[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < c.size() && !IsLowerAlnum(c[j])) ++j;
    std::string_view sep = c.substr(i, j - i);
    bool ok = sep == "." || sep == "_" || sep == "__" ||
              sep.find_first_not_of('-') == std::string_view::npos;
    if (!ok) {
      return "has invalid separator " + Quote(sep) +
             " (allowed between letters/digits: \".\", \"_\", \"__\" or dashes)";
    }
    i = j;
  }
  return std::nullopt;
}

// Why a DNS name or IPv4 address (without port) is invalid, or nullopt.
std::optional<std::string> HostnameProblem(std::string_view name) {
  if (name.empty()) return "has an empty host name";
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    std::string_view label =
        name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty()) return "has an empty label (leading, trailing or doubled \".\")";
    if (label.size() > 63) return "has a label longer than 63 bytes";
    if (!IsAlnum(label.front()) || !IsAlnum(label.back())) {
      return "has a label " + Quote(label) + " that does not start and end with a letter or digit";
    }
    for (char c : label) {
      if (!IsAlnum(c) && c != '-') return "contains invalid character " + Char(c);
    }
    if (dot == std::string_view::npos) return std::nullopt;
    start = dot + 1;
  }
}

Error ImageRefError(std::string_view text, const Error& cause) {
  return MakeError(cause.code, "image reference " + Quote(text) + ": " + Printable(cause.message));
}

}  // namespace

Status ValidateName(std::string_view name) {
  if (name.empty()) return MakeError(ErrorCode::kInvalidArgument, "repository name is empty");
  if (name.size() > kMaxNameLength) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "repository name " + Quote(name, 64) + " is " + std::to_string(name.size()) +
                         " bytes long (max " + std::to_string(kMaxNameLength) + ")");
  }
  size_t start = 0;
  for (int index = 1;; ++index) {
    size_t slash = name.find('/', start);
    std::string_view component = name.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (auto problem = ComponentProblem(component)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "repository name " + Quote(name) + ": path component " +
                           std::to_string(index) + " " + Quote(component) + " " + *problem);
    }
    if (slash == std::string_view::npos) return Ok();
    start = slash + 1;
  }
}

Status ValidateTag(std::string_view tag) {
  if (tag.empty()) return MakeError(ErrorCode::kInvalidArgument, "tag is empty");
  if (tag.size() > kMaxTagLength) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "tag " + Quote(tag, 64) + " is " + std::to_string(tag.size()) +
                         " bytes long (max " + std::to_string(kMaxTagLength) + ")");
  }
  if (!IsAlnum(tag.front()) && tag.front() != '_') {
    return MakeError(ErrorCode::kInvalidArgument,
                     "tag " + Quote(tag) + " must start with a letter, digit or \"_\", not " +
                         Char(tag.front()));
  }
  for (char c : tag) {
    if (!IsAlnum(c) && c != '_' && c != '.' && c != '-') {
      return MakeError(ErrorCode::kInvalidArgument,
                       "tag " + Quote(tag) + " contains invalid character " + Char(c) +
                           " (allowed: letters, digits, \"_\", \".\", \"-\")");
    }
  }
  return Ok();
}

Status ValidateRegistryHost(std::string_view host) {
  auto fail = [&](const std::string& why) {
    return MakeError(ErrorCode::kInvalidArgument, "registry host " + Quote(host) + " " + why);
  };
  if (host.empty()) return fail("is empty");
  if (host.size() > kMaxHostLength) return fail("is longer than 255 bytes");
  std::string_view port;
  if (host.front() == '[') {
    size_t close = host.find(']');
    if (close == std::string_view::npos) return fail("has \"[\" without \"]\"");
    std::string_view addr = host.substr(1, close - 1);
    // Hex digits and colons are not enough ("[cfff]" is none): it must parse as an address.
    in6_addr parsed{};
    if (addr.empty() || addr.size() > 45 || !std::all_of(addr.begin(), addr.end(), [](char c) {
          return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':';
        }) || ::inet_pton(AF_INET6, std::string(addr).c_str(), &parsed) != 1) {
      return fail("has an invalid IPv6 address in brackets");
    }
    std::string_view after = host.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return fail("has text after \"]\" that is not a \":port\"");
      port = after.substr(1);
      if (port.empty()) return fail("has an empty port");
    }
  } else {
    size_t colon = host.find(':');
    if (auto problem = HostnameProblem(host.substr(0, colon))) return fail(*problem);
    if (colon != std::string_view::npos) {
      port = host.substr(colon + 1);
      if (port.empty()) return fail("has an empty port");
    }
  }
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), IsDigit) ||
        std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535) {
      return fail("has an invalid port " + Quote(port) + " (want 1-65535)");
    }
  }
  return Ok();
}

bool LooksLikeRegistryHost(std::string_view component) {
  return component.find_first_of(".:") != std::string_view::npos || component == "localhost";
}

std::string NormalizeRegistryHost(std::string_view host) {
  if (host == "index.docker.io" || host == "registry-1.docker.io") return std::string(kDockerHub);
  return std::string(host);
}

std::string ManifestRef::str() const { return digest ? digest->str() : tag; }

Result<ManifestRef> ParseManifestRef(std::string_view ref) {
  if (ref.find(':') != std::string_view::npos) {
    auto digest = Digest::Parse(ref);
    if (!digest) return MakeError(digest.error().code, Printable(digest.error().message));
    return ManifestRef{"", digest.value()};
  }
  if (auto ok = ValidateTag(ref); !ok) return ok.error();
  return ManifestRef{std::string(ref), std::nullopt};
}

std::string ImageRef::str() const {
  std::string out = registry + "/" + repository;
  if (!tag.empty()) out += ":" + tag;
  if (digest) out += "@" + digest->str();
  return out;
}

std::string ImageRef::RefString() const { return digest ? digest->str() : tag; }

Result<ImageRef> ParseImageRef(std::string_view text) {
  if (text.empty()) return MakeError(ErrorCode::kInvalidArgument, "image reference is empty");
  if (text.size() > kMaxImageRefLength) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "image reference " + Quote(text, 64) + " is " + std::to_string(text.size()) +
                         " bytes long (max " + std::to_string(kMaxImageRefLength) + ")");
  }
  ImageRef ref;
  std::string_view rest = text;
  if (size_t at = rest.find('@'); at != std::string_view::npos) {
    auto digest = Digest::Parse(rest.substr(at + 1));
    if (!digest) return ImageRefError(text, digest.error());
    ref.digest = digest.value();
    rest = rest.substr(0, at);
  }
  // A ":" after the last "/" starts the tag; one before it belongs to a host:port.
  size_t last_slash = rest.rfind('/');
  size_t last_colon = rest.rfind(':');
  if (last_colon != std::string_view::npos &&
      (last_slash == std::string_view::npos || last_colon > last_slash)) {
    std::string_view tag = rest.substr(last_colon + 1);
    if (auto ok = ValidateTag(tag); !ok) return ImageRefError(text, ok.error());
    ref.tag = std::string(tag);
    rest = rest.substr(0, last_colon);
  }
  if (rest.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "image reference " + Quote(text) + " has no repository name");
  }
  size_t first_slash = rest.find('/');
  if (first_slash != std::string_view::npos && LooksLikeRegistryHost(rest.substr(0, first_slash))) {
    std::string_view host = rest.substr(0, first_slash);
    if (auto ok = ValidateRegistryHost(host); !ok) return ImageRefError(text, ok.error());
    ref.registry = NormalizeRegistryHost(host);
    ref.repository = std::string(rest.substr(first_slash + 1));
  } else {
    ref.registry = std::string(kDockerHub);
    ref.repository = std::string(rest);
  }
  if (ref.registry == kDockerHub && ref.repository.find('/') == std::string::npos) {
    ref.repository = "library/" + ref.repository;
  }
  if (auto ok = ValidateName(ref.repository); !ok) return ImageRefError(text, ok.error());
  if (ref.tag.empty() && !ref.digest) ref.tag = "latest";
  return ref;
}

std::optional<SplitName> SplitRegistryPrefix(std::string_view name) {
  size_t slash = name.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string_view host = name.substr(0, slash);
  if (!LooksLikeRegistryHost(host) || !ValidateRegistryHost(host)) return std::nullopt;
  SplitName split{NormalizeRegistryHost(host), std::string(name.substr(slash + 1))};
  if (split.registry == kDockerHub && !split.repository.empty() &&
      split.repository.find('/') == std::string::npos) {
    split.repository = "library/" + split.repository;
  }
  return split;
}

}  // namespace shoal::oci
