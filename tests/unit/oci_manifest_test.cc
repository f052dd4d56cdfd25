#include <doctest/doctest.h>

#include <string>

#include "lib/oci/manifest.h"
#include "lib/oci/media_types.h"

#include "tests/support/why.h"

namespace shoal::oci {
namespace {

// Shaped like what Docker Hub, gcr.io and skopeo produce (digests are sha256 of "a".."e").
constexpr std::string_view kDockerV2Sample = R"({
   "schemaVersion": 2,
   "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
   "config": {
      "mediaType": "application/vnd.docker.container.image.v1+json",
      "size": 1457,
      "digest": "sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
   },
   "layers": [
      {
         "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
         "size": 2152262,
         "digest": "sha256:3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
      },
      {
         "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
         "size": 32,
         "digest": "sha256:2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6"
      }
   ]
})";

constexpr std::string_view kOciManifestSample =
    R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",)"
    R"("config":{"mediaType":"application/vnd.oci.image.config.v1+json",)"
    R"("digest":"sha256:18ac3e7343f016890c510e93f935261169d9e3f565436429830faf0934f4f8e4",)"
    R"("size":581},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd",)"
    R"("digest":"sha256:3f79bb7b435b05321651daefd374cdc681dc06faa65e374e38337b88ca046dea",)"
    R"("size":3623807,"annotations":{"org.opencontainers.image.title":"rootfs"}}],)"
    R"("annotations":{"org.opencontainers.image.created":"2024-01-01T00:00:00Z"}})";

// A Docker manifest list for a multi-arch image, as served for library/busybox.
constexpr std::string_view kDockerListSample = R"({
  "manifests": [
    {
      "digest": "sha256:252f10c83610ebca1a059c0bae8255eba2f95be4d1d7bcfa89d7248a82d9f111",
      "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
      "platform": {"architecture": "amd64", "os": "linux"},
      "size": 528
    },
    {
      "digest": "sha256:cd0aa9856147b6c5b4ff2b7dfee5da20aa38253099ef1b4a64aced233c9afe29",
      "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
      "platform": {"architecture": "arm", "os": "linux", "variant": "v7"},
      "size": 528
    },
    {
      "digest": "sha256:aaa9402664f1a41f40ebbc52c9993eb66aeb366602958fdfaa283b71e64db123",
      "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
      "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"},
      "size": 528
    }
  ],
  "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
  "schemaVersion": 2
})";

// An OCI index as buildx writes it, with an attestation entry of platform unknown/unknown.
constexpr std::string_view kOciIndexSample =
    R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[)"
    R"({"mediaType":"application/vnd.oci.image.manifest.v1+json",)"
    R"("digest":"sha256:252f10c83610ebca1a059c0bae8255eba2f95be4d1d7bcfa89d7248a82d9f111",)"
    R"("size":1234,"platform":{"architecture":"amd64","os":"linux"}},)"
    R"({"mediaType":"application/vnd.oci.image.manifest.v1+json",)"
    R"("digest":"sha256:cd0aa9856147b6c5b4ff2b7dfee5da20aa38253099ef1b4a64aced233c9afe29",)"
    R"("size":566,"annotations":{"vnd.docker.reference.type":"attestation-manifest"},)"
    R"("platform":{"architecture":"unknown","os":"unknown"}}]})";

constexpr const char* kDigestA =
    "sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb";

// A manifest JSON with one layer whose descriptor body is given.
std::string WithLayer(const std::string& layer) {
  return R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",)"
         R"("config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":2,)"
         R"("digest":")" +
         std::string(kDigestA) + R"("},"layers":[)" + layer + "]}";
}

std::string Layer(const std::string& fields) { return "{" + fields + "}"; }

std::string ErrorOf(std::string_view body, std::string_view content_type = "") {
  auto m = ParseManifest(body, content_type);
  REQUIRE_FALSE(m.has_value());
  CHECK(m.error().code == ErrorCode::kInvalidArgument);
  return m.error().message;
}

bool Has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("oci manifest: parses a Docker schema2 image manifest") {
  auto m = ParseManifest(kDockerV2Sample, kDockerManifestV2);
  REQUIRE(m.has_value());
  CHECK(m.value().media_type == kDockerManifestV2);
  CHECK_FALSE(m.value().is_index);
  REQUIRE(m.value().config.has_value());
  CHECK(m.value().config->media_type == kDockerConfig);
  CHECK(m.value().config->size == 1457);
  CHECK(m.value().config->digest.str() == kDigestA);
  REQUIRE(m.value().layers.size() == 2);
  CHECK(m.value().layers[0].media_type == kDockerLayerGzip);
  CHECK(m.value().layers[0].size == 2152262);
  CHECK(m.value().layers[0].digest.hex() ==
        "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d");
  CHECK_FALSE(m.value().layers[0].platform.has_value());
  CHECK(m.value().layers[1].size == 32);
  CHECK(m.value().manifests.empty());
}

TEST_CASE("oci manifest: parses an OCI image manifest with annotations and zstd layers") {
  auto m = ParseManifest(kOciManifestSample, "application/vnd.oci.image.manifest.v1+json");
  REQUIRE(m.has_value());
  CHECK(m.value().media_type == kOciManifest);
  CHECK_FALSE(m.value().is_index);
  CHECK(m.value().config->media_type == kOciConfig);
  REQUIRE(m.value().layers.size() == 1);
  CHECK(m.value().layers[0].media_type == kOciLayerZstd);
  CHECK(m.value().layers[0].size == 3623807);
}

TEST_CASE("oci manifest: parses a multi-arch Docker manifest list with platforms") {
  auto m = ParseManifest(kDockerListSample, kDockerManifestList);
  REQUIRE(m.has_value());
  CHECK(m.value().media_type == kDockerManifestList);
  CHECK(m.value().is_index);
  CHECK_FALSE(m.value().config.has_value());
  CHECK(m.value().layers.empty());
  REQUIRE(m.value().manifests.size() == 3);
  const auto& amd64 = m.value().manifests[0];
  CHECK(amd64.media_type == kDockerManifestV2);
  CHECK(amd64.size == 528);
  REQUIRE(amd64.platform.has_value());
  CHECK(amd64.platform->os == "linux");
  CHECK(amd64.platform->architecture == "amd64");
  CHECK(amd64.platform->variant.empty());
  CHECK(m.value().manifests[1].platform->architecture == "arm");
  CHECK(m.value().manifests[1].platform->variant == "v7");
  CHECK(m.value().manifests[2].platform->architecture == "arm64");
  CHECK(m.value().manifests[2].platform->variant == "v8");
  CHECK(m.value().manifests[2].digest.hex() ==
        "aaa9402664f1a41f40ebbc52c9993eb66aeb366602958fdfaa283b71e64db123");
}

TEST_CASE("oci manifest: parses an OCI index with an attestation entry") {
  auto m = ParseManifest(kOciIndexSample, kOciIndex);
  REQUIRE(m.has_value());
  CHECK(m.value().media_type == kOciIndex);
  CHECK(m.value().is_index);
  REQUIRE(m.value().manifests.size() == 2);
  CHECK(m.value().manifests[0].platform->architecture == "amd64");
  CHECK(m.value().manifests[1].platform->os == "unknown");
}

TEST_CASE("oci manifest: takes the media type from the Content-Type when the body has none") {
  std::string body = R"({"schemaVersion":2,"manifests":[]})";
  auto list = ParseManifest(body, "application/vnd.docker.distribution.manifest.list.v2+json");
  REQUIRE(list.has_value());
  CHECK(list.value().media_type == kDockerManifestList);
  CHECK(list.value().is_index);
  CHECK(list.value().manifests.empty());

  // Parameters and case in the header do not matter.
  auto with_params = ParseManifest(body, " Application/VND.OCI.Image.Index.v1+json; charset=utf-8");
  REQUIRE(with_params.has_value());
  CHECK(with_params.value().media_type == kOciIndex);
}

TEST_CASE("oci manifest: infers the type from the body when neither names it") {
  auto index = ParseManifest(R"({"schemaVersion":2,"manifests":[]})", "");
  REQUIRE(index.has_value());
  CHECK(index.value().media_type == kOciIndex);
  CHECK(index.value().is_index);

  std::string image =
      WithLayer(Layer(R"("mediaType":"x","size":1,"digest":")" + std::string(kDigestA) + "\""));
  // Remove the mediaType of the manifest itself (the first one in the text).
  auto pos = image.find(R"("mediaType":"application/vnd.oci.image.manifest.v1+json",)");
  REQUIRE(pos != std::string::npos);
  image.erase(
      pos, std::string_view(R"("mediaType":"application/vnd.oci.image.manifest.v1+json",)").size());
  auto inferred = ParseManifest(image, "application/json");
  REQUIRE(inferred.has_value());
  CHECK(inferred.value().media_type == kOciManifest);
  CHECK_FALSE(inferred.value().is_index);
  CHECK(inferred.value().layers.size() == 1);

  // A generic Content-Type does not contradict the body.
  CHECK(ParseManifest(kDockerV2Sample, "application/octet-stream").has_value());
}

TEST_CASE("oci manifest: rejects bodies that are not JSON objects") {
  CHECK(Has(ErrorOf(""), "not valid JSON"));
  CHECK(Has(ErrorOf("{"), "not valid JSON"));
  CHECK(Has(ErrorOf("{\"schemaVersion\":2,}"), "not valid JSON"));
  CHECK(Has(ErrorOf("{\"schemaVersion\":2,}"), "line 1"));
  CHECK(Has(ErrorOf("\xff\xfe"), "not valid JSON"));
  CHECK(Has(ErrorOf("{\"a\":\"\xc3\x28\"}"), "not valid JSON"));
  CHECK(Has(ErrorOf("[]"), "not a JSON object"));
  CHECK(Has(ErrorOf("2"), "not a JSON object"));
  CHECK(Has(ErrorOf("\"x\""), "not a JSON object"));
  CHECK(Has(ErrorOf("null"), "not a JSON object"));
}

TEST_CASE("oci manifest: rejects a schemaVersion other than 2") {
  CHECK(Has(ErrorOf(R"({"manifests":[]})"), "no schemaVersion"));
  CHECK(Has(
      ErrorOf(R"({"schemaVersion":1,"name":"x","tag":"1","fsLayers":[]})", kDockerSchema1Signed),
      "schema1"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":3,"manifests":[]})"), "schemaVersion is 3, want 2"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":"2","manifests":[]})"), "schemaVersion is \"2\""));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2.0,"manifests":[]})"), "want 2"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":-2,"manifests":[]})"), "want 2"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":null,"manifests":[]})"), "want 2"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2,"mediaType":")" + std::string(kDockerSchema1) +
                    R"(","manifests":[]})"),
            "schema1"));
}

TEST_CASE("oci manifest: rejects a body mediaType that contradicts the Content-Type") {
  auto message = ErrorOf(kDockerV2Sample, kOciManifest);
  CHECK(Has(message, "contradicts"));
  CHECK(Has(message, std::string(kOciManifest)));
  CHECK(Has(ErrorOf(kDockerListSample, kDockerManifestV2), "contradicts"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2,"mediaType":"text/plain","manifests":[]})"),
            "not a manifest or index type"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2,"mediaType":7,"manifests":[]})"), "not a string"));
}

TEST_CASE("oci manifest: rejects a manifest with neither layers nor manifests") {
  CHECK(Has(ErrorOf(R"({"schemaVersion":2})"), "neither layers nor manifests"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2,"config":{}})"), "neither layers nor manifests"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2,"mediaType":")" + std::string(kOciIndex) + R"("})"),
            "no manifests array"));
  // An index type served for an image manifest body.
  CHECK(Has(ErrorOf(kOciManifestSample, kOciIndex), "contradicts"));
  std::string no_layers = R"({"schemaVersion":2,"mediaType":")" + std::string(kDockerManifestV2) +
                          R"(","config":{"mediaType":"a","size":1,"digest":")" + kDigestA + "\"}}";
  CHECK(Has(ErrorOf(no_layers), "no layers array"));
  std::string no_config =
      R"({"schemaVersion":2,"mediaType":")" + std::string(kDockerManifestV2) + R"(","layers":[]})";
  CHECK(Has(ErrorOf(no_config), "no config"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2,"manifests":{}})"), "not an array"));
  CHECK(Has(ErrorOf(R"({"schemaVersion":2,"manifests":[1]})"), "manifests[0] is 1"));
}

TEST_CASE("oci manifest: rejects descriptors with a bad digest, size or mediaType") {
  std::string digest = std::string("\"digest\":\"") + kDigestA + "\"";
  CHECK(ParseManifest(WithLayer(Layer(R"("mediaType":"m","size":0,)" + digest)), "").has_value());

  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":1,"digest":"sha256:abc")"))),
            "layers[0]: digest"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":1,"digest":5)"))),
            "layers[0] digest is 5, not a string"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":1)"))), "layers[0] has no digest"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m",)" + digest))), "layers[0] has no size"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":-1,)" + digest))),
            "layers[0] has negative size -1"));
  CHECK(
      Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":1.5,)" + digest))), "not an integer"));
  CHECK(
      Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":"10",)" + digest))), "not an integer"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":18446744073709551615,)" + digest))),
            "too large"));
  CHECK(
      Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":1e3,)" + digest))), "not an integer"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("size":1,)" + digest))), "layers[0] has no mediaType"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"","size":1,)" + digest))), "empty mediaType"));
  CHECK(Has(ErrorOf(WithLayer(Layer(R"("mediaType":"m","size":1,)" + digest) + ",[]")),
            "layers[1] is a JSON array, not an object"));

  // An unregistered algorithm is well-formed but not supported; sha512 is.
  auto sha384 = ParseManifest(WithLayer(Layer(R"("mediaType":"m","size":1,"digest":"sha384:)" +
                                              std::string(96, 'a') + "\"")),
                              "");
  REQUIRE_FALSE(sha384.has_value());
  CHECK(sha384.error().code == ErrorCode::kUnsupported);
  auto sha512 = ParseManifest(WithLayer(Layer(R"("mediaType":"m","size":1,"digest":"sha512:)" +
                                              std::string(128, 'a') + "\"")),
                              "");
  REQUIRE_MESSAGE(sha512.has_value(), Why(sha512));
  CHECK(sha512.value().layers[0].digest.str() == "sha512:" + std::string(128, 'a'));

  // The config descriptor is checked the same way.
  std::string bad_config =
      R"({"schemaVersion":2,"config":{"mediaType":"c","size":-5,)" + digest + R"(},"layers":[]})";
  CHECK(Has(ErrorOf(bad_config), "config has negative size"));
}

TEST_CASE("oci manifest: rejects malformed platforms") {
  auto entry = [](const std::string& platform) {
    return R"({"schemaVersion":2,"manifests":[{"mediaType":"m","size":1,"digest":")" +
           std::string(kDigestA) + R"(","platform":)" + platform + "}]}";
  };
  CHECK(ParseManifest(entry(R"({"os":"linux","architecture":"s390x"})"), "").has_value());
  CHECK(Has(ErrorOf(entry("\"linux/amd64\"")), "manifests[0] platform is"));
  CHECK(Has(ErrorOf(entry(R"({"os":"linux"})")), "has no architecture"));
  CHECK(Has(ErrorOf(entry(R"({"architecture":"amd64"})")), "has no os"));
  CHECK(Has(ErrorOf(entry(R"({"os":"linux","architecture":1})")), "not a string"));
  CHECK(Has(ErrorOf(entry(R"({"os":"linux","architecture":"arm","variant":7})")), "variant is 7"));
}

TEST_CASE("oci manifest: bounds size, nesting and descriptor count") {
  std::string big(kMaxManifestBytes + 1, ' ');
  CHECK(Has(ErrorOf(big), "max 4194304"));

  std::string deep(100000, '[');
  CHECK(Has(ErrorOf(deep), "nests deeper"));
  // Brackets inside strings do not count as nesting.
  std::string in_string = R"({"schemaVersion":2,"manifests":[],"x":")" + std::string(1000, '[') +
                          "\\\"" + std::string(1000, '{') + "\"}";
  CHECK(ParseManifest(in_string, "").has_value());

  std::string entry = R"({"mediaType":"m","size":1,"digest":")" + std::string(kDigestA) + "\"}";
  std::string many = R"({"schemaVersion":2,"manifests":[)";
  for (size_t i = 0; i <= kMaxDescriptors; ++i) {
    if (i > 0) many += ",";
    many += entry;
  }
  many += "]}";
  REQUIRE(many.size() < kMaxManifestBytes);
  CHECK(Has(ErrorOf(many), "lists 10001 manifests (max 10000)"));
}

TEST_CASE("oci media types: classifies manifest and index types") {
  CHECK(IsIndexType(kDockerManifestList));
  CHECK(IsIndexType(kOciIndex));
  CHECK_FALSE(IsIndexType(kOciManifest));
  CHECK_FALSE(IsIndexType(kDockerManifestV2));
  for (auto type : {kDockerManifestV2, kDockerManifestList, kOciManifest, kOciIndex, kDockerSchema1,
                    kDockerSchema1Signed}) {
    CHECK(IsManifestType(type));
  }
  for (auto type : {kOciLayerGzip, kOciLayerZstd, kOciLayerTar, kDockerLayerGzip, kOciConfig,
                    kDockerConfig, kOctetStream, std::string_view("")}) {
    CHECK_FALSE(IsManifestType(type));
  }
  CHECK(NormalizeMediaType("  Application/Json ; charset=utf-8") == "application/json");
  CHECK(NormalizeMediaType(" ; q=1").empty());
}

TEST_CASE("oci accept: splits, trims, lowercases and drops parameters") {
  auto list = ParseAccept(
      "application/vnd.docker.distribution.manifest.v2+json; q=0.9 ,"
      "\tApplication/VND.OCI.Image.Index.v1+json,,  ,*/*;q=0.1");
  REQUIRE(list.size() == 3);
  CHECK(list[0] == kDockerManifestV2);
  CHECK(list[1] == kOciIndex);
  CHECK(list[2] == "*/*");
  CHECK(ParseAccept("").empty());
  CHECK(ParseAccept(" , ;q=1,").empty());

  std::string many;
  for (int i = 0; i < 100; ++i) many += "type/t" + std::to_string(i) + ",";
  auto bounded = ParseAccept(many);
  REQUIRE(bounded.size() == kMaxAcceptEntries);
  CHECK(bounded.back() == "type/t63");
}

TEST_CASE("oci accept: decides whether a client takes a media type") {
  CHECK(Accepts({}, kOciManifest));
  CHECK(Accepts(ParseAccept("*/*"), kOciManifest));
  CHECK(Accepts(ParseAccept("application/*"), kOciIndex));
  CHECK(Accepts(ParseAccept(std::string(kOciManifest) + ", */*"), kDockerManifestV2));
  auto docker_only =
      ParseAccept(std::string(kDockerManifestV2) + "," + std::string(kDockerManifestList));
  CHECK(Accepts(docker_only, kDockerManifestV2));
  CHECK(Accepts(docker_only, kDockerManifestList));
  CHECK_FALSE(Accepts(docker_only, kOciManifest));
  CHECK_FALSE(Accepts(docker_only, kOciIndex));
  CHECK_FALSE(Accepts(ParseAccept("text/*"), kOciIndex));
  CHECK(Accepts(ParseAccept("APPLICATION/VND.OCI.IMAGE.MANIFEST.V1+JSON"), kOciManifest));
}

TEST_CASE("oci accept: the upstream Accept names the four modern manifest types") {
  auto upstream = UpstreamManifestAccept();
  auto list = ParseAccept(upstream);
  REQUIRE(list.size() == 4);
  CHECK(list[0] == kDockerManifestV2);
  CHECK(list[1] == kDockerManifestList);
  CHECK(list[2] == kOciManifest);
  CHECK(list[3] == kOciIndex);
  CHECK_FALSE(Has(upstream, "v1+prettyjws"));
}

TEST_CASE("oci negotiate: a schema2-only client gets a Docker list's linux/amd64 child by tag") {
  const std::string arm = "sha256:" + std::string(64, 'a');
  const std::string amd = "sha256:" + std::string(64, 'b');
  auto entry = [](const std::string& digest, const std::string& arch) {
    return std::string(R"({"mediaType":"application/vnd.docker.distribution.manifest.v2+json",)") +
           R"("size":10,"digest":")" + digest + R"(","platform":{"os":"linux","architecture":")" +
           arch + R"("}})";
  };
  const std::string list = std::string(R"({"schemaVersion":2,"mediaType":")") +
                           std::string(kDockerManifestList) + R"(","manifests":[)" +
                           entry(arm, "arm64") + "," + entry(amd, "amd64") + "]}";
  const std::vector<std::string> schema2 = {std::string(kDockerManifestV2)};

  Negotiation child = NegotiateManifest(schema2, kDockerManifestList, list, true);
  CHECK(child.kind == Negotiation::Kind::kChild);
  REQUIRE(child.child.has_value());
  CHECK(child.child->str() == amd);
  // A client that accepts the list gets the list; so does one that accepts anything.
  CHECK(
      NegotiateManifest({std::string(kDockerManifestList)}, kDockerManifestList, list, true).kind ==
      Negotiation::Kind::kServe);
  CHECK(NegotiateManifest({}, kDockerManifestList, list, true).kind == Negotiation::Kind::kServe);
  // By digest the list itself is served: nothing else has that digest.
  CHECK(NegotiateManifest(schema2, kDockerManifestList, list, false).kind ==
        Negotiation::Kind::kServe);
  CHECK(NegotiateManifest({std::string(kOciManifest)}, kDockerManifestV2, "{}", false).kind ==
        Negotiation::Kind::kServe);
  // No linux/amd64 entry: refused.
  const std::string arm_only = std::string(R"({"schemaVersion":2,"mediaType":")") +
                               std::string(kDockerManifestList) + R"(","manifests":[)" +
                               entry(arm, "arm64") + "]}";
  Negotiation none = NegotiateManifest(schema2, kDockerManifestList, arm_only, true);
  CHECK(none.kind == Negotiation::Kind::kRefuse);
  CHECK(none.reason.find("linux/amd64") != std::string::npos);
  // A client that names neither (OCI manifest only) is refused the list by tag.
  CHECK(NegotiateManifest({std::string(kOciManifest)}, kDockerManifestList, list, true).kind ==
        Negotiation::Kind::kRefuse);
}

TEST_CASE("oci negotiate: OCI indexes and manifests are never rewritten, by tag or digest") {
  const std::vector<std::string> schema2 = {std::string(kDockerManifestV2)};
  for (bool by_tag : {true, false}) {
    Negotiation index = NegotiateManifest(schema2, kOciIndex, "{}", by_tag);
    CHECK(index.kind == Negotiation::Kind::kRefuse);
    CHECK(index.reason.find(std::string(kOciIndex)) != std::string::npos);
    CHECK(NegotiateManifest(schema2, kOciManifest, "{}", by_tag).kind ==
          Negotiation::Kind::kRefuse);
  }
  CHECK(NegotiateManifest({std::string(kOciIndex)}, kOciIndex, "{}", true).kind ==
        Negotiation::Kind::kServe);
  // Schema2 by tag to a client that does not take it: refused (docker-registry tries schema1).
  CHECK(NegotiateManifest({std::string(kOciManifest)}, kDockerManifestV2, "{}", true).kind ==
        Negotiation::Kind::kRefuse);
}

}  // namespace shoal::oci
