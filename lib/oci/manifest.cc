#include "lib/oci/manifest.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "lib/oci/media_types.h"
#include "lib/oci/quote.h"

namespace shoal::oci {
namespace {

using json = nlohmann::json;

Error Invalid(std::string message) {
  return MakeError(ErrorCode::kInvalidArgument, "manifest " + std::move(message));
}

// The DOM parser's nesting is bounded only by memory; counting brackets outside strings first
// keeps a hostile body from building millions of nested values.
bool NestsDeeperThan(std::string_view body, size_t limit) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

// Collects the parser's own description of a syntax error; the DOM parse without exceptions
// only reports that one happened.
class SyntaxErrorSax : public json::json_sax_t {
 public:
  std::string message;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
};

std::string DescribeSyntaxError(std::string_view body) {
  SyntaxErrorSax sax;
  json::sax_parse(body.begin(), body.end(), &sax, nlohmann::detail::input_format_t::json, false);
  std::string_view text = sax.message;
  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> from "parse error".
  if (size_t pos = text.find("] "); pos != std::string_view::npos) text.remove_prefix(pos + 2);
  if (text.empty()) return "is not valid JSON";
  // The message quotes input bytes ("last read: ..."); keep it printable and short.
  return "is not valid JSON: " + Printable(text, 200);
}

std::string Describe(const json& value) {
  if (value.is_number_integer() || value.is_boolean() || value.is_null()) return value.dump();
  if (value.is_string()) return Quote(value.get_ref<const std::string&>());
  return std::string("a JSON ") + value.type_name();
}

// Reads a required string member of a descriptor or platform object.
Result<std::string> RequiredString(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) return Invalid(where + " has no " + key);
  if (!it->is_string()) {
    return Invalid(where + " " + key + " is " + Describe(*it) + ", not a string");
  }
  return it->get<std::string>();
}

Result<Platform> ParsePlatform(const json& value, const std::string& where) {
  if (!value.is_object()) return Invalid(where + " platform is " + Describe(value));
  Platform platform;
  auto os = RequiredString(value, "os", where + " platform");
  if (!os) return os.error();
  auto arch = RequiredString(value, "architecture", where + " platform");
  if (!arch) return arch.error();
  platform.os = std::move(os.value());
  platform.architecture = std::move(arch.value());
  if (auto it = value.find("variant"); it != value.end()) {
    if (!it->is_string()) {
      return Invalid(where + " platform variant is " + Describe(*it) + ", not a string");
    }
    platform.variant = it->get<std::string>();
  }
  return platform;
}

Result<Descriptor> ParseDescriptor(const json& value, const std::string& where) {
  if (!value.is_object()) return Invalid(where + " is " + Describe(value) + ", not an object");

  auto media_type = RequiredString(value, "mediaType", where);
  if (!media_type) return media_type.error();
  if (media_type.value().empty()) return Invalid(where + " has an empty mediaType");

  auto digest_text = RequiredString(value, "digest", where);
  if (!digest_text) return digest_text.error();
  auto digest = Digest::Parse(digest_text.value());
  if (!digest) {
    return MakeError(digest.error().code,
                     "manifest " + where + ": " + Printable(digest.error().message));
  }

  auto size_it = value.find("size");
  if (size_it == value.end()) return Invalid(where + " has no size");
  int64_t size = 0;
  if (size_it->is_number_unsigned()) {
    auto u = size_it->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(where + " size " + std::to_string(u) + " is too large");
    }
    size = static_cast<int64_t>(u);
  } else if (size_it->is_number_integer()) {
    size = size_it->get<int64_t>();
    if (size < 0) return Invalid(where + " has negative size " + std::to_string(size));
  } else {
    return Invalid(where + " size is " + Describe(*size_it) + ", not an integer");
  }

  std::optional<Platform> platform;
  if (auto it = value.find("platform"); it != value.end()) {
    auto parsed = ParsePlatform(*it, where);
    if (!parsed) return parsed.error();
    platform = std::move(parsed.value());
  }
  return Descriptor{std::move(media_type.value()), std::move(digest.value()), size,
                    std::move(platform)};
}

Result<std::vector<Descriptor>> ParseDescriptorArray(const json& doc, const char* key,
                                                     std::string_view media_type) {
  auto it = doc.find(key);
  if (it == doc.end()) {
    return Invalid("of type " + std::string(media_type) + " has no " + key + " array");
  }
  if (!it->is_array()) return Invalid(std::string(key) + " is " + Describe(*it) + ", not an array");
  if (it->size() > kMaxDescriptors) {
    return Invalid("lists " + std::to_string(it->size()) + " " + key + " (max " +
                   std::to_string(kMaxDescriptors) + ")");
  }
  std::vector<Descriptor> out;
  out.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    auto d = ParseDescriptor((*it)[i], std::string(key) + "[" + std::to_string(i) + "]");
    if (!d) return d.error();
    out.push_back(std::move(d.value()));
  }
  return out;
}

// Decides the manifest's media type from the body and the Content-Type it was served with.
Result<std::string> ResolveMediaType(const json& doc, std::string_view content_type) {
  std::string served = NormalizeMediaType(content_type);
  if (auto it = doc.find("mediaType"); it != doc.end()) {
    if (!it->is_string()) return Invalid("mediaType is " + Describe(*it) + ", not a string");
    const auto& declared = it->get_ref<const std::string&>();
    if (!IsManifestType(declared)) {
      return Invalid("mediaType " + Quote(declared) + " is not a manifest or index type");
    }
    if (IsManifestType(served) && served != declared) {
      return Invalid("mediaType " + Quote(declared) + " contradicts its Content-Type " +
                     Quote(served));
    }
    return declared;
  }
  if (IsManifestType(served)) return served;
  if (doc.contains("manifests")) return std::string(kOciIndex);
  if (doc.contains("config") && doc.contains("layers")) return std::string(kOciManifest);
  return Invalid("has neither layers nor manifests (and no mediaType)");
}

}  // namespace

Result<Manifest> ParseManifest(std::string_view body, std::string_view content_type) {
  if (body.size() > kMaxManifestBytes) {
    return Invalid("is " + std::to_string(body.size()) + " bytes (max " +
                   std::to_string(kMaxManifestBytes) + ")");
  }
  if (NestsDeeperThan(body, kMaxJsonDepth)) {
    return Invalid("JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Invalid(DescribeSyntaxError(body));
  if (!doc.is_object()) return Invalid("is " + Describe(doc) + ", not a JSON object");

  auto version = doc.find("schemaVersion");
  if (version == doc.end()) return Invalid("has no schemaVersion");
  bool is_two = version->is_number_unsigned()  ? version->get<uint64_t>() == 2
                : version->is_number_integer() ? version->get<int64_t>() == 2
                                               : false;
  if (!is_two) {
    bool is_one = version->is_number_integer() && version->get<int64_t>() == 1;
    return Invalid("schemaVersion is " + Describe(*version) +
                   (is_one ? " (Docker schema1, not supported)" : "") + ", want 2");
  }

  auto media_type = ResolveMediaType(doc, content_type);
  if (!media_type) return media_type.error();
  if (IsSchema1Type(media_type.value())) {
    return Invalid("media type " + Quote(media_type.value()) +
                   " is Docker schema1, which cannot have schemaVersion 2");
  }

  Manifest manifest;
  manifest.media_type = std::move(media_type.value());
  manifest.is_index = IsIndexType(manifest.media_type);
  if (manifest.is_index) {
    auto manifests = ParseDescriptorArray(doc, "manifests", manifest.media_type);
    if (!manifests) return manifests.error();
    manifest.manifests = std::move(manifests.value());
    return manifest;
  }
  auto config = doc.find("config");
  if (config == doc.end()) {
    return Invalid("of type " + manifest.media_type + " has no config descriptor");
  }
  auto config_descriptor = ParseDescriptor(*config, "config");
  if (!config_descriptor) return config_descriptor.error();
  manifest.config = std::move(config_descriptor.value());
  auto layers = ParseDescriptorArray(doc, "layers", manifest.media_type);
  if (!layers) return layers.error();
  manifest.layers = std::move(layers.value());
  return manifest;
}

std::vector<std::string> ParseAccept(std::string_view header) {
  std::vector<std::string> out;
  size_t start = 0;
  while (out.size() < kMaxAcceptEntries) {
    size_t comma = header.find(',', start);
    std::string type = NormalizeMediaType(header.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (!type.empty()) out.push_back(std::move(type));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

bool Accepts(const std::vector<std::string>& accept, std::string_view media_type) {
  if (accept.empty()) return true;
  std::string type = NormalizeMediaType(media_type);
  for (const auto& entry : accept) {
    if (entry == "*/*" || entry == type) return true;
    if (entry == "application/*" && type.starts_with("application/")) return true;
  }
  return false;
}

Negotiation NegotiateManifest(const std::vector<std::string>& accept, std::string_view media_type,
                              std::string_view body, bool by_tag) {
  Negotiation out;
  if (Accepts(accept, media_type)) return out;
  const std::string type = NormalizeMediaType(media_type);
  const bool names_schema2 =
      std::find(accept.begin(), accept.end(), kDockerManifestV2) != accept.end();
  if (by_tag && type == kDockerManifestList && names_schema2) {
    auto list = ParseManifest(body, type);
    if (list) {
      for (const auto& d : list.value().manifests) {
        if (d.platform && d.platform->os == "linux" && d.platform->architecture == "amd64") {
          out.kind = Negotiation::Kind::kChild;
          out.child = d.digest;
          return out;
        }
      }
    }
    out.kind = Negotiation::Kind::kRefuse;
    out.reason =
        "the manifest list has no linux/amd64 manifest for a client that accepts only "
        "single-platform manifests";
    return out;
  }
  if (!by_tag && (type == kDockerManifestList || type == kDockerManifestV2)) return out;
  out.kind = Negotiation::Kind::kRefuse;
  out.reason = "it is " + type + ", which the client does not accept";
  return out;
}

std::string UpstreamManifestAccept() {
  std::string out;
  for (std::string_view type : {kDockerManifestV2, kDockerManifestList, kOciManifest, kOciIndex}) {
    if (!out.empty()) out += ", ";
    out += type;
  }
  return out;
}

}  // namespace shoal::oci
