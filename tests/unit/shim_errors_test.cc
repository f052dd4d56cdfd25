#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "registry-shim/errors.h"

namespace shoal::shim {

TEST_CASE("shim errors: upstream URLs and IP addresses never reach the client's message") {
  CHECK(RedactAddresses("manifest demo/app:nope not found at "
                        "http://127.0.0.1:5000/v2/demo/app/manifests/nope (MANIFEST_UNKNOWN: "
                        "manifest unknown)") ==
        "manifest demo/app:nope not found at <upstream URL> (MANIFEST_UNKNOWN: manifest unknown)");
  CHECK(RedactAddresses("blob x: https://mirror.corp/v2/x/blobs/sha256:ab: answered 500") ==
        "blob x: <upstream URL>: answered 500");
  CHECK(RedactAddresses("cannot connect to http://[fd00::1]:8443/v2/: timed out.") ==
        "cannot connect to <upstream URL>: timed out.");
  CHECK(RedactAddresses("peer 10.1.2.3:6881 sent junk; tracker 192.168.0.7 down") ==
        "peer <address> sent junk; tracker <address> down");
  CHECK(RedactAddresses("peer [2001:db8::7]:6881 left") == "peer <address> left");
  CHECK(RedactAddresses("TLS handshake with registry.internal:443 failed: eof") ==
        "TLS handshake with <address> failed: eof");
  CHECK(RedactAddresses("token server (http://auth.local/token?scope=x) refused") ==
        "token server (<upstream URL>) refused");
}

TEST_CASE("shim errors: digests, tags, names, versions and sizes are kept") {
  for (const char* kept :
       {"blob sha256:0123456789abcdef is not cached", "tag demo/app:1 of gcr.io/proj/img",
        "registry gcr.io is not in this agent's upstream map", "registry/2.0 1.2.3 v1.36:x",
        "Range header \"bytes=0-5\" is outside a representation of 100 bytes",
        "digest \"sha512:abc\" must have 128 lowercase hex characters after sha512:"}) {
    CAPTURE(kept);
    CHECK(RedactAddresses(kept) == kept);
  }
}

TEST_CASE("shim errors: the reply body is redacted and says so, status and code are kept") {
  Error e = MakeError(ErrorCode::kUnavailable,
                      "manifest a:1: http://10.0.0.5:5000/v2/a/manifests/1 answered 503");
  ErrorReply r = MakeErrorReply(e, "MANIFEST_UNKNOWN");
  CHECK(r.status == 503);
  CHECK(r.redacted);
  CHECK(r.retry_after_s == 1);
  auto body = nlohmann::json::parse(r.body);
  CHECK(body["errors"][0]["code"] == "MANIFEST_UNKNOWN");
  CHECK(body["errors"][0]["message"] == "manifest a:1: <upstream URL> answered 503");
  CHECK(r.body.find("10.0.0.5") == std::string::npos);
  ErrorReply plain = MakeErrorReply(MakeError(ErrorCode::kNotFound, "no such tag"), "X");
  CHECK_FALSE(plain.redacted);
}

TEST_CASE("shim errors: every refused registry gets one reply, whatever the reason") {
  const std::string reasons[] = {
      "registry quay.io is not in this agent's upstream map (mapped: docker.io)",
      "registry 127.0.0.1:17998 is not in this agent's upstream map (mapped: docker.io) and is "
      "not a global address (--unmapped https reaches public registries only)",
      "manifest a:1: not connecting to https://localhost:5000/v2/a/manifests/1: 127.0.0.1 is not "
      "a global address",
      "cannot resolve the host of https://nowhere.invalid/v2/: Host not found"};
  const ErrorReply first = MakeErrorReply(MakeError(ErrorCode::kRefused, reasons[0]), "");
  CHECK(first.status == 404);
  CHECK(first.retry_after_s == 0);
  CHECK(first.redacted);  // the caller logs the reason
  auto body = nlohmann::json::parse(first.body);
  CHECK(body["errors"][0]["code"] == "NAME_UNKNOWN");
  CHECK(body["errors"][0]["message"] == std::string(kRefusedRegistryMessage));
  for (const std::string& reason : reasons) {
    for (const char* oci_code : {"", "NAME_UNKNOWN", "MANIFEST_UNKNOWN", "BLOB_UNKNOWN"}) {
      CAPTURE(reason);
      CAPTURE(oci_code);
      ErrorReply r = MakeErrorReply(MakeError(ErrorCode::kRefused, reason), oci_code);
      CHECK(r.status == first.status);
      CHECK(r.body == first.body);
    }
  }
}

}  // namespace shoal::shim
