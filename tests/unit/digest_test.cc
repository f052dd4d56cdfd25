#include <doctest/doctest.h>

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
            .error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha256:").error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse(":abc").error().code == ErrorCode::kInvalidArgument);
  CHECK(Digest::Parse("sha512:abcd").error().code == ErrorCode::kUnsupported);
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
