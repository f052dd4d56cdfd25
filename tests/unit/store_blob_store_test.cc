#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lib/core/content_hash.h"
#include "lib/core/sha256.h"
#include "lib/store/blob_store.h"

namespace shoal::store {
namespace fs = std::filesystem;

namespace {
struct TempRoot {
  std::string path;
  TempRoot() {
    char tmpl[] = "/tmp/shoal-store-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempRoot() { fs::remove_all(path); }
};
}  // namespace

TEST_CASE("store: a committed blob is visible at its digest with its size") {
  TempRoot root;
  auto store = BlobStore::Open(root.path);
  REQUIRE(store.has_value());
  std::string data = "hello blob";
  Digest d = Sha256::Of(data);
  CHECK_FALSE(store.value()->Stat(d).has_value());
  auto w = store.value()->Create(d);
  REQUIRE(w.has_value());
  REQUIRE(w.value()->PWrite(data.data() + 5, data.size() - 5, 5).has_value());
  REQUIRE(w.value()->PWrite(data.data(), 5, 0).has_value());
  CHECK_FALSE(store.value()->Stat(d).has_value());  // not visible before commit
  REQUIRE(w.value()->Commit().has_value());
  REQUIRE(store.value()->Stat(d).has_value());
  CHECK(*store.value()->Stat(d) == data.size());
  CHECK(Sha256File(store.value()->BlobPath(d)).value() == d);
}

TEST_CASE("store: a sha512 blob and manifest live under blobs/sha512 and survive a reopen") {
  TempRoot root;
  std::string data = "hello sha512 blob";
  Digest d = ContentHash::Of(DigestAlgorithm::kSha512, data);
  std::string manifest = R"({"schemaVersion":2})";
  Digest m = ContentHash::Of(DigestAlgorithm::kSha512, manifest);
  {
    auto store = BlobStore::Open(root.path).value();
    auto w = store->Create(d).value();
    REQUIRE(w->PWrite(data.data(), data.size(), 0).has_value());
    REQUIRE(w->Commit().has_value());
    CHECK(store->BlobPath(d) ==
          root.path + "/blobs/sha512/" + d.hex().substr(0, 2) + "/" + d.hex());
    CHECK(*store->Stat(d) == data.size());
    // The same bytes by sha256 are another blob.
    CHECK_FALSE(store->Stat(Sha256::Of(data)).has_value());
    REQUIRE(
        store->PutManifest(m, manifest, "application/vnd.oci.image.manifest.v1+json").has_value());
    // Bytes that do not hash to a sha512 digest are refused.
    CHECK(store->PutManifest(m, manifest + " ", "x").error().code == ErrorCode::kDigestMismatch);
  }
  auto reopened = BlobStore::Open(root.path).value();
  CHECK(*reopened->Stat(d) == data.size());
  CHECK(reopened->Stats().bytes == data.size() + manifest.size());
  auto got = reopened->GetManifest(m);
  REQUIRE(got.has_value());
  CHECK(got->body == manifest);
}

TEST_CASE("store: an aborted or dropped writer leaves nothing behind") {
  TempRoot root;
  auto store = BlobStore::Open(root.path).value();
  Digest d = Sha256::Of(std::string("x"));
  {
    auto w = store->Create(d).value();
    REQUIRE(w->PWrite("x", 1, 0).has_value());
  }
  {
    auto w = store->Create(d).value();
    w->Abort();
  }
  CHECK_FALSE(store->Stat(d).has_value());
  CHECK(fs::is_empty(root.path + "/tmp"));
}

TEST_CASE("store: reopening removes leftover temp files and keeps complete blobs") {
  TempRoot root;
  Digest d = Sha256::Of(std::string("kept"));
  {
    auto store = BlobStore::Open(root.path).value();
    auto w = store->Create(d).value();
    REQUIRE(w->PWrite("kept", 4, 0).has_value());
    REQUIRE(w->Commit().has_value());
  }
  std::ofstream(root.path + "/tmp/crashed.partial") << "partial bytes";
  auto store = BlobStore::Open(root.path).value();
  CHECK(store->cleaned_temp_files() == 1);
  CHECK(store->Stat(d).has_value());
}

TEST_CASE("store: manifests round-trip with their media type and are verified") {
  TempRoot root;
  auto store = BlobStore::Open(root.path).value();
  std::string body = R"({"schemaVersion":2})";
  Digest d = Sha256::Of(body);
  REQUIRE(store->PutManifest(d, body, "application/vnd.oci.image.manifest.v1+json").has_value());
  auto m = store->GetManifest(d);
  REQUIRE(m.has_value());
  CHECK(m->body == body);
  CHECK(m->media_type == "application/vnd.oci.image.manifest.v1+json");
  Digest other = Sha256::Of(std::string("other"));
  auto bad = store->PutManifest(other, body, "x");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == ErrorCode::kDigestMismatch);
  // A manifest whose bytes were corrupted on disk is not served.
  std::ofstream(store->BlobPath(d), std::ios::trunc) << "{\"schemaVersion\":3}";
  CHECK_FALSE(store->GetManifest(d).has_value());
}

}  // namespace shoal::store
