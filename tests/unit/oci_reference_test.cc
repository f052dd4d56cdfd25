#include <doctest/doctest.h>

#include <string>

#include "lib/oci/reference.h"

namespace shoal::oci {
namespace {

constexpr const char* kHex = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb";

std::string Sha(const char* hex = kHex) { return std::string("sha256:") + hex; }

bool NameOk(std::string_view name) { return ValidateName(name).has_value(); }
bool TagOk(std::string_view tag) { return ValidateTag(tag).has_value(); }

std::string NameError(std::string_view name) {
  auto s = ValidateName(name);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code == ErrorCode::kInvalidArgument);
  return s.error().message;
}

}  // namespace

TEST_CASE("oci name: accepts distribution-spec repository names") {
  for (const char* name :
       {"a", "busybox", "library/busybox", "proj/img", "a/b/c/d/e", "a0/9z", "my-app", "my--app",
        "my---app", "my.app", "my_app", "my__app", "a.b-c_d__e", "gcr.io", "0", "x/y.z"}) {
    CAPTURE(name);
    CHECK(NameOk(name));
  }
  CHECK(NameOk(std::string(255, 'a')));
  std::string components;
  while (components.size() < 253) components += "ab/";
  components.resize(253);
  if (components.back() == '/') components.back() = 'c';
  CHECK(NameOk(components));
}

TEST_CASE("oci name: rejects malformed names and says which component and why") {
  CHECK(NameError("").find("empty") != std::string::npos);

  auto upper = NameError("library/BusyBox");
  CHECK(upper.find("component 2") != std::string::npos);
  CHECK(upper.find("\"BusyBox\"") != std::string::npos);
  CHECK(upper.find("uppercase") != std::string::npos);

  auto sep = NameError("proj/a._b");
  CHECK(sep.find("component 2") != std::string::npos);
  CHECK(sep.find("separator \"._\"") != std::string::npos);

  CHECK(NameError("a__-b").find("separator") != std::string::npos);
  CHECK(NameError("a___b").find("separator \"___\"") != std::string::npos);
  CHECK(NameError("a..b").find("separator \"..\"") != std::string::npos);
  CHECK(NameError("a-_b").find("separator") != std::string::npos);
  CHECK(NameError("-a").find("starts with") != std::string::npos);
  CHECK(NameError("a/.b").find("component 2") != std::string::npos);
  CHECK(NameError("a-").find("ends with") != std::string::npos);
  CHECK(NameError("a/b_").find("ends with") != std::string::npos);
  CHECK(NameError("/a").find("component 1") != std::string::npos);
  CHECK(NameError("a/").find("component 2") != std::string::npos);
  CHECK(NameError("a//b").find("empty") != std::string::npos);
  CHECK(NameError("127.0.0.1:5000/a").find("invalid character \":\"") != std::string::npos);
  CHECK(NameError("a b").find("invalid character \" \"") != std::string::npos);
  CHECK(NameError(std::string("a\0b", 3)).find("\\x00") != std::string::npos);
  CHECK(NameError("caf\xc3\xa9").find("\\xc3") != std::string::npos);
  CHECK(NameError("a@b").find("invalid character") != std::string::npos);

  auto long_name = NameError(std::string(256, 'a'));
  CHECK(long_name.find("256 bytes") != std::string::npos);
  CHECK(long_name.find("max 255") != std::string::npos);
}

TEST_CASE("oci tag: accepts valid tags and rejects invalid ones with the reason") {
  for (const char* tag :
       {"latest", "1", "1.36.1", "v1.2.3-rc.1", "_private", "A_B", "x--y..z", "sha256_abc"}) {
    CAPTURE(tag);
    CHECK(TagOk(tag));
  }
  CHECK(TagOk(std::string(128, 'a')));

  auto too_long = ValidateTag(std::string(129, 'a'));
  REQUIRE_FALSE(too_long.has_value());
  CHECK(too_long.error().code == ErrorCode::kInvalidArgument);
  CHECK(too_long.error().message.find("max 128") != std::string::npos);

  CHECK(ValidateTag("").error().message == "tag is empty");
  CHECK(ValidateTag(".hidden").error().message.find("must start with") != std::string::npos);
  CHECK(ValidateTag("-x").error().message.find("must start with") != std::string::npos);
  CHECK(ValidateTag("a:b").error().message.find("invalid character \":\"") != std::string::npos);
  CHECK(ValidateTag("a/b").error().message.find("invalid character \"/\"") != std::string::npos);
  CHECK_FALSE(TagOk("a b"));
  CHECK_FALSE(TagOk("a+b"));
}

TEST_CASE("oci manifest ref: parses a tag or a digest and round-trips") {
  auto tag = ParseManifestRef("1.36");
  REQUIRE(tag.has_value());
  CHECK_FALSE(tag.value().IsDigest());
  CHECK(tag.value().tag == "1.36");
  CHECK(tag.value().str() == "1.36");

  auto digest = ParseManifestRef(Sha());
  REQUIRE(digest.has_value());
  CHECK(digest.value().IsDigest());
  CHECK(digest.value().tag.empty());
  CHECK(digest.value().digest->hex() == kHex);
  CHECK(digest.value().str() == Sha());
}

TEST_CASE("oci manifest ref: propagates digest errors and rejects bad tags") {
  auto short_digest = ParseManifestRef("sha256:abc");
  REQUIRE_FALSE(short_digest.has_value());
  CHECK(short_digest.error().code == ErrorCode::kInvalidArgument);

  auto sha384 = ParseManifestRef("sha384:" + std::string(96, 'a'));
  REQUIRE_FALSE(sha384.has_value());
  CHECK(sha384.error().code == ErrorCode::kUnsupported);
  auto sha512 = ParseManifestRef("sha512:" + std::string(128, 'a'));
  REQUIRE(sha512.has_value());
  CHECK(sha512.value().str() == "sha512:" + std::string(128, 'a'));

  auto upper_hex = ParseManifestRef("sha256:" + std::string(64, 'A'));
  REQUIRE_FALSE(upper_hex.has_value());
  CHECK(upper_hex.error().code == ErrorCode::kInvalidArgument);

  CHECK(ParseManifestRef("").error().code == ErrorCode::kInvalidArgument);
  CHECK(ParseManifestRef("a/b").error().code == ErrorCode::kInvalidArgument);
  CHECK(ParseManifestRef(std::string(129, 't')).error().code == ErrorCode::kInvalidArgument);
  CHECK(ParseManifestRef(":").error().code == ErrorCode::kInvalidArgument);
}

TEST_CASE("oci image ref: normalises docker hub short names") {
  auto busybox = ParseImageRef("busybox");
  REQUIRE(busybox.has_value());
  CHECK(busybox.value().registry == "docker.io");
  CHECK(busybox.value().repository == "library/busybox");
  CHECK(busybox.value().tag == "latest");
  CHECK_FALSE(busybox.value().digest.has_value());
  CHECK(busybox.value().str() == "docker.io/library/busybox:latest");
  CHECK(busybox.value().RefString() == "latest");

  auto user = ParseImageRef("someuser/app:2");
  REQUIRE(user.has_value());
  CHECK(user.value().registry == "docker.io");
  CHECK(user.value().repository == "someuser/app");
  CHECK(user.value().tag == "2");

  for (const char* text : {"docker.io/busybox:1", "index.docker.io/library/busybox:1",
                           "registry-1.docker.io/busybox:1", "library/busybox:1"}) {
    CAPTURE(text);
    auto ref = ParseImageRef(text);
    REQUIRE(ref.has_value());
    CHECK(ref.value().str() == "docker.io/library/busybox:1");
  }
}

TEST_CASE("oci image ref: keeps other registries, ports and digests") {
  auto gcr = ParseImageRef("gcr.io/p/img:1");
  REQUIRE(gcr.has_value());
  CHECK(gcr.value().registry == "gcr.io");
  CHECK(gcr.value().repository == "p/img");
  CHECK(gcr.value().tag == "1");

  auto local = ParseImageRef("127.0.0.1:5000/a/b@" + Sha());
  REQUIRE(local.has_value());
  CHECK(local.value().registry == "127.0.0.1:5000");
  CHECK(local.value().repository == "a/b");
  CHECK(local.value().tag.empty());
  CHECK(local.value().digest->hex() == kHex);
  CHECK(local.value().RefString() == Sha());
  CHECK(local.value().str() == "127.0.0.1:5000/a/b@" + Sha());

  auto both = ParseImageRef("quay.io/org/app:v1@" + Sha());
  REQUIRE(both.has_value());
  CHECK(both.value().tag == "v1");
  CHECK(both.value().RefString() == Sha());
  CHECK(both.value().str() == "quay.io/org/app:v1@" + Sha());

  auto localhost = ParseImageRef("localhost/x");
  REQUIRE(localhost.has_value());
  CHECK(localhost.value().registry == "localhost");
  CHECK(localhost.value().repository == "x");
  CHECK(localhost.value().tag == "latest");

  auto port_only = ParseImageRef("localhost:5000/x:dev");
  REQUIRE(port_only.has_value());
  CHECK(port_only.value().registry == "localhost:5000");
  CHECK(port_only.value().tag == "dev");

  auto ipv6 = ParseImageRef("[::1]:5000/app:1");
  REQUIRE(ipv6.has_value());
  CHECK(ipv6.value().registry == "[::1]:5000");
  CHECK(ipv6.value().repository == "app");

  // A first component without ".", ":" or "localhost" is part of the repository.
  auto not_host = ParseImageRef("myregistry/app");
  REQUIRE(not_host.has_value());
  CHECK(not_host.value().registry == "docker.io");
  CHECK(not_host.value().repository == "myregistry/app");
}

TEST_CASE("oci image ref: round-trips through str()") {
  for (const char* text :
       {"busybox", "gcr.io/p/img:1", "localhost/x", "a.b.c:443/x/y/z:t_1", "[::1]/app",
        "docker.io/someuser/app@sha256:"
        "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785"
        "afee48bb"}) {
    CAPTURE(text);
    auto first = ParseImageRef(text);
    REQUIRE(first.has_value());
    auto second = ParseImageRef(first.value().str());
    REQUIRE(second.has_value());
    CHECK(second.value().str() == first.value().str());
    CHECK(second.value().registry == first.value().registry);
    CHECK(second.value().repository == first.value().repository);
  }
}

TEST_CASE("oci image ref: rejects malformed references with the reason") {
  auto upper = ParseImageRef("gcr.io/Proj/img");
  REQUIRE_FALSE(upper.has_value());
  CHECK(upper.error().code == ErrorCode::kInvalidArgument);
  CHECK(upper.error().message.find("uppercase") != std::string::npos);
  CHECK(upper.error().message.find("gcr.io/Proj/img") != std::string::npos);

  CHECK(ParseImageRef("BusyBox").error().message.find("uppercase") != std::string::npos);
  CHECK(ParseImageRef("").error().code == ErrorCode::kInvalidArgument);
  CHECK(ParseImageRef("busybox:").error().message.find("tag is empty") != std::string::npos);
  CHECK(ParseImageRef(":tag").error().message.find("no repository") != std::string::npos);
  CHECK(ParseImageRef("busybox@").error().code == ErrorCode::kInvalidArgument);
  CHECK(ParseImageRef("busybox@sha256:abc").error().code == ErrorCode::kInvalidArgument);
  CHECK(ParseImageRef("busybox@sha384:" + std::string(96, 'a')).error().code ==
        ErrorCode::kUnsupported);
  CHECK(ParseImageRef("busybox@sha512:" + std::string(128, 'a')).value().digest->str() ==
        "sha512:" + std::string(128, 'a'));
  CHECK(ParseImageRef("a@b@" + Sha()).error().code == ErrorCode::kInvalidArgument);
  CHECK_FALSE(ParseImageRef("gcr.io/").has_value());
  CHECK_FALSE(ParseImageRef("gcr.io//x").has_value());
  CHECK_FALSE(ParseImageRef("busybox:a/b").has_value());
  CHECK_FALSE(ParseImageRef("bad..host/x").has_value());
  CHECK_FALSE(ParseImageRef("-host.io/x").has_value());
  CHECK_FALSE(ParseImageRef("host.io:/x").has_value());
  CHECK_FALSE(ParseImageRef("host.io:99999/x").has_value());
  CHECK_FALSE(ParseImageRef("host.io:0/x").has_value());
  CHECK_FALSE(ParseImageRef("host.io:50a/x").has_value());
  CHECK_FALSE(ParseImageRef("[::1/x").has_value());
  CHECK_FALSE(ParseImageRef("[zz]/x").has_value());
  CHECK_FALSE(ParseImageRef("[::1]x/y").has_value());
  CHECK_FALSE(ParseImageRef("a b").has_value());
  CHECK_FALSE(ParseImageRef(std::string(2000, 'a')).has_value());
  // "localhost:5000" alone is docker's name "localhost" with tag "5000", not a host.
  auto bare = ParseImageRef("localhost:5000");
  REQUIRE(bare.has_value());
  CHECK(bare.value().str() == "docker.io/library/localhost:5000");
}

TEST_CASE("oci registry host: validates names, IPs, IPv6 and ports") {
  for (const char* host :
       {"gcr.io", "localhost", "localhost:5000", "127.0.0.1:5000", "my-registry.example.com",
        "[::1]", "[fe80::1]:443", "A.B", "x:1", "x:65535"}) {
    CAPTURE(host);
    CHECK(ValidateRegistryHost(host).has_value());
  }
  for (const char* host :
       {"", ".io", "a..b", "a.", "-a.io", "a-.io", "a_b.io", "a.io:", "a.io:65536", "a.io:0",
        "a.io:1:2", "[]", "[::1", "[::1]:", "[::1]a", "a.io:+80",
        // Hex digits without the shape of an address (found by the connect_target fuzzer).
        "[cfff]:7", "[c:::f]", "[1:2:3:4:5:6:7:8:9]"}) {
    CAPTURE(host);
    auto s = ValidateRegistryHost(host);
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code == ErrorCode::kInvalidArgument);
    CHECK(s.error().message.find("registry host") != std::string::npos);
  }
}

TEST_CASE("oci split name: splits a leading registry host off a repository name") {
  auto gcr = SplitRegistryPrefix("gcr.io/proj/img");
  REQUIRE(gcr.has_value());
  CHECK(gcr->registry == "gcr.io");
  CHECK(gcr->repository == "proj/img");

  auto hub = SplitRegistryPrefix("docker.io/busybox");
  REQUIRE(hub.has_value());
  CHECK(hub->registry == "docker.io");
  CHECK(hub->repository == "library/busybox");

  auto hub_user = SplitRegistryPrefix("registry-1.docker.io/user/app");
  REQUIRE(hub_user.has_value());
  CHECK(hub_user->registry == "docker.io");
  CHECK(hub_user->repository == "user/app");

  auto port = SplitRegistryPrefix("127.0.0.1:5000/a/b");
  REQUIRE(port.has_value());
  CHECK(port->registry == "127.0.0.1:5000");
  CHECK(port->repository == "a/b");

  auto localhost = SplitRegistryPrefix("localhost/x");
  REQUIRE(localhost.has_value());
  CHECK(localhost->registry == "localhost");
  CHECK(localhost->repository == "x");

  // The rest is not validated here: the shim validates it next.
  auto unvalidated = SplitRegistryPrefix("gcr.io/Bad");
  REQUIRE(unvalidated.has_value());
  CHECK(unvalidated->repository == "Bad");
  CHECK_FALSE(ValidateName(unvalidated->repository).has_value());

  CHECK_FALSE(SplitRegistryPrefix("library/busybox").has_value());
  CHECK_FALSE(SplitRegistryPrefix("busybox").has_value());
  CHECK_FALSE(SplitRegistryPrefix("gcr.io").has_value());
  CHECK_FALSE(SplitRegistryPrefix("").has_value());
  CHECK_FALSE(SplitRegistryPrefix("a..b/c").has_value());
  CHECK_FALSE(SplitRegistryPrefix(":5000/c").has_value());
}

TEST_CASE("oci registry host: recognises hosts and docker hub aliases") {
  CHECK(LooksLikeRegistryHost("gcr.io"));
  CHECK(LooksLikeRegistryHost("localhost"));
  CHECK(LooksLikeRegistryHost("host:5000"));
  CHECK_FALSE(LooksLikeRegistryHost("library"));
  CHECK_FALSE(LooksLikeRegistryHost("Localhost"));
  CHECK(NormalizeRegistryHost("index.docker.io") == "docker.io");
  CHECK(NormalizeRegistryHost("registry-1.docker.io") == "docker.io");
  CHECK(NormalizeRegistryHost("docker.io") == "docker.io");
  CHECK(NormalizeRegistryHost("quay.io") == "quay.io");
}

}  // namespace shoal::oci
