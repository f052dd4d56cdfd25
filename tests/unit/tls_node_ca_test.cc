// The node CA of the HTTPS proxy mode: created once with a private key file, leaves that a
// client trusting only the CA accepts for their host and no other.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "lib/tls/node_ca.h"
#include "lib/tls/peer_tls.h"

#include "tests/support/why.h"

namespace shoal::tls {
namespace fs = std::filesystem;

namespace {

std::unique_ptr<X509, decltype(&X509_free)> ParsePem(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return {cert, &X509_free};
}

// Whether leaf_pem chains to ca_pem alone (as a client with only the CA in its roots sees it).
bool VerifiesAgainst(const std::string& leaf_pem, const std::string& ca_pem,
                     int purpose = X509_PURPOSE_SSL_SERVER) {
  auto leaf = ParsePem(leaf_pem);
  auto ca = ParsePem(ca_pem);
  if (!leaf || !ca) return false;
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca.get());
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf.get(), nullptr);
  X509_STORE_CTX_set_purpose(ctx, purpose);
  bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return ok;
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/shoal-ca-XXXXXX";
  return ::mkdtemp(tmpl);
}

}  // namespace

TEST_CASE("tls: the node CA is created once with a 0600 key and the same CA is loaded again") {
  const std::string root = MakeTempDir();
  const std::string dir = root + "/proxy-ca";
  std::string first_pem;
  {
    auto ca = NodeCa::LoadOrCreate(dir);
    REQUIRE_MESSAGE(ca.has_value(), Why(ca));
    first_pem = ca.value()->cert_pem();
    CHECK(first_pem.find("BEGIN CERTIFICATE") != std::string::npos);
    CHECK(first_pem.find("PRIVATE KEY") == std::string::npos);
  }
  struct stat key_st {
  }, dir_st{};
  REQUIRE(::stat((dir + "/ca.key").c_str(), &key_st) == 0);
  REQUIRE(::stat(dir.c_str(), &dir_st) == 0);
  CHECK((key_st.st_mode & 0777) == 0600);
  CHECK((dir_st.st_mode & 0777) == 0700);
  auto again = NodeCa::LoadOrCreate(dir);
  REQUIRE_MESSAGE(again.has_value(), Why(again));
  CHECK(again.value()->cert_pem() == first_pem);
  // The same files given explicitly (--proxy-ca-cert/--proxy-ca-key).
  auto given = NodeCa::Load(dir + "/ca.crt", dir + "/ca.key");
  REQUIRE_MESSAGE(given.has_value(), Why(given));
  CHECK(given.value()->cert_pem() == first_pem);
  fs::remove_all(root);
}

TEST_CASE("tls: a leaf verifies against the node CA for its host only, and is cached per host") {
  const std::string root = MakeTempDir();
  auto ca = NodeCa::LoadOrCreate(root + "/proxy-ca");
  REQUIRE_MESSAGE(ca.has_value(), Why(ca));
  NodeCa& node_ca = *ca.value();

  auto leaf = node_ca.LeafCertPem("gcr.io");
  REQUIRE_MESSAGE(leaf.has_value(), Why(leaf));
  CHECK(VerifiesAgainst(leaf.value(), node_ca.cert_pem()));
  auto cert = ParsePem(leaf.value());
  REQUIRE(cert);
  CHECK(X509_check_host(cert.get(), "gcr.io", 0, 0, nullptr) == 1);
  CHECK(X509_check_host(cert.get(), "evil.example", 0, 0, nullptr) != 1);
  EVP_PKEY* pub = X509_get0_pubkey(cert.get());
  REQUIRE(pub != nullptr);
  CHECK(EVP_PKEY_is_a(pub, "EC"));
  CHECK(EVP_PKEY_get_bits(pub) == 256);
  // Short-lived: at most NodeCa::kLeafValidity from now.
  const auto limit = std::chrono::system_clock::to_time_t(
      std::chrono::system_clock::now() + NodeCa::kLeafValidity + std::chrono::minutes(1));
  CHECK(X509_cmp_time(X509_get0_notAfter(cert.get()), const_cast<time_t*>(&limit)) < 0);

  auto cached = node_ca.LeafCertPem("gcr.io");
  REQUIRE(cached.has_value());
  CHECK(cached.value() == leaf.value());
  auto other = node_ca.LeafCertPem("quay.io");
  REQUIRE(other.has_value());
  CHECK(other.value() != leaf.value());
  CHECK(node_ca.ServerContext("gcr.io").has_value());

  // An IP literal gets an IP SAN.
  auto ip_leaf = node_ca.LeafCertPem("127.0.0.1");
  REQUIRE(ip_leaf.has_value());
  auto ip_cert = ParsePem(ip_leaf.value());
  CHECK(X509_check_ip_asc(ip_cert.get(), "127.0.0.1", 0) == 1);

  // Another node's CA is not trusted for this node's leaves.
  auto stranger = NodeCa::LoadOrCreate(root + "/other-ca");
  REQUIRE(stranger.has_value());
  CHECK_FALSE(VerifiesAgainst(leaf.value(), stranger.value()->cert_pem()));
  fs::remove_all(root);
}

TEST_CASE("tls: a CA dir with a key but no certificate, or a key of another CA, is refused") {
  const std::string root = MakeTempDir();
  auto a = NodeCa::LoadOrCreate(root + "/a");
  auto b = NodeCa::LoadOrCreate(root + "/b");
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  auto mismatched = NodeCa::Load(root + "/a/ca.crt", root + "/b/ca.key");
  REQUIRE_FALSE(mismatched.has_value());
  CHECK(mismatched.error().code == ErrorCode::kInvalidArgument);
  CHECK(mismatched.error().message.find("does not belong") != std::string::npos);

  fs::remove(root + "/a/ca.crt");
  auto half = NodeCa::LoadOrCreate(root + "/a");
  REQUIRE_FALSE(half.has_value());
  CHECK(half.error().message.find("without") != std::string::npos);

  auto missing = NodeCa::Load(root + "/nope.crt", root + "/nope.key");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == ErrorCode::kIo);
  fs::remove_all(root);
}

TEST_CASE("tls: an agent's peer certificate comes from the cluster CA and names any torrent") {
  const std::string root = MakeTempDir();
  auto ca = NodeCa::LoadOrCreate(root + "/peer-ca", "shoal cluster peer CA");
  REQUIRE_MESSAGE(ca.has_value(), Why(ca));
  auto minted = MintPeerTls(root + "/peer-ca/ca.crt", root + "/peer-ca/ca.key", "node-7");
  REQUIRE_MESSAGE(minted.has_value(), Why(minted));
  const PeerTls& t = minted.value();
  CHECK(t.ca_pem == ca.value()->cert_pem());
  // Peers are both TLS client and server to each other.
  CHECK(VerifiesAgainst(t.cert_pem, t.ca_pem, X509_PURPOSE_SSL_SERVER));
  CHECK(VerifiesAgainst(t.cert_pem, t.ca_pem, X509_PURPOSE_SSL_CLIENT));
  auto cert = ParsePem(t.cert_pem);
  REQUIRE(cert);
  CHECK(X509_check_host(cert.get(), "*", 1, X509_CHECK_FLAG_NO_WILDCARDS, nullptr) == 1);
  char cn[64] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, cn, sizeof(cn));
  CHECK(std::string(cn) == "node-7");
  CHECK(t.key_pem.find("PRIVATE KEY") != std::string::npos);
  CHECK(t.dh_pem.find("BEGIN DH PARAMETERS") != std::string::npos);
  CHECK(t.not_after > std::chrono::system_clock::now() + std::chrono::hours(24 * 300));
  // Two agents get two keys.
  auto second = MintPeerTls(root + "/peer-ca/ca.crt", root + "/peer-ca/ca.key", "node-8");
  REQUIRE(second.has_value());
  CHECK(second.value().key_pem != t.key_pem);
  // The tracker reads the CA certificate in the same canonical form.
  auto read = ReadCertPemFile(root + "/peer-ca/ca.crt");
  REQUIRE(read.has_value());
  CHECK(read.value() == t.ca_pem);
  CHECK(ReadCertPemFile(root + "/peer-ca/ca.key").error().code == ErrorCode::kInvalidArgument);
  CHECK(ReadCertPemFile(root + "/missing").error().code == ErrorCode::kIo);
  // A leaf is no CA to mint from.
  auto leaf_dir = root + "/leaf";
  fs::create_directories(leaf_dir);
  std::ofstream(leaf_dir + "/c.pem") << t.cert_pem;
  std::ofstream(leaf_dir + "/k.pem") << t.key_pem;
  auto not_ca = MintPeerTls(leaf_dir + "/c.pem", leaf_dir + "/k.pem", "x");
  REQUIRE_FALSE(not_ca.has_value());
  CHECK(not_ca.error().message.find("not a CA") != std::string::npos);
  fs::remove_all(root);
}

}  // namespace shoal::tls
