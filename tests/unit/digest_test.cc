#include <doctest/doctest.h>

#include "lib/core/content_hash.h"
#include "lib/core/digest.h"
#include "lib/core/sha256.h"

namespace shoal {

TEST_CASE("digest: parses a sha256 digest") {
  auto d = Digest::Parse("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  REQUIRE(d.has_value());
  CHECK(d.value().hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("digest: rejects malformed digests with a precise reason") {
  CHECK(Digest::Parse("e3b0c442").error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha256:XYZ").error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855")
            .error()
            .code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha256:").error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse(":abc").error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha512:abcd").error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha512:" + std::string(64, 'a')).error().code ==
        ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha256:" + std::string(128, 'a')).error().code ==
        ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha384:" + std::string(96, 'a')).error().code == ErrorCode::kUnsupported);
  CHECK(Digest::Parse("md5:abcd").error().code == ErrorCode::kUnsupported);
}

TEST_CASE("digest: parses a sha512 digest, distinct from a sha256 one") {
  const std::string hex(128, 'b');
  auto d = Digest::Parse("sha512:" + hex);
  REQUIRE(d.has_value());
  CHECK(d.value().algorithm() == DigestAlgorithm::kSha512);
  CHECK(d.value().hex() == hex);
  CHECK(d.value().str() == "sha512:" + hex);
  auto s = Digest::Parse("sha256:" + std::string(64, 'b'));
  REQUIRE(s.has_value());
  CHECK(s.value().algorithm() == DigestAlgorithm::kSha256);
  CHECK(s.value() != d.value());
}

TEST_CASE("content hash: sha512 and sha256 of known strings, one-shot and streamed") {
  // FIPS 180-2 test vector "abc".
  CHECK(ContentHash::Of(DigestAlgorithm::kSha512, "abc").str() ==
        "sha512:ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
        "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f");
  CHECK(ContentHash::Of(DigestAlgorithm::kSha256, "abc") == Sha256::Of("abc"));
  ContentHash h(DigestAlgorithm::kSha512);
  h.Update("a", 1);
  h.Update("bc", 2);
  Digest streamed = h.Final();
  CHECK(streamed == ContentHash::Of(DigestAlgorithm::kSha512, "abc"));
  CHECK(ContentHash::Matches(streamed, "abc"));
  CHECK_FALSE(ContentHash::Matches(streamed, "abd"));
  // Final resets the hasher.
  CHECK(h.Final() == ContentHash::Of(DigestAlgorithm::kSha512, ""));
}

TEST_CASE("sha256: matches the known hash of the empty string and of abc") {
  CHECK(Sha256::Of("", 0).hex() ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;
  h.Update("a", 1);
  h.Update("bc", 2);
  CHECK(h.FinalHex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace shoal
