#include "lib/tls/node_ca.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <spdlog/spdlog.h>
#include <boost/asio/ip/address.hpp>

namespace shoal::tls {
namespace {

namespace ssl = boost::asio::ssl;

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;
using CertPtr = std::unique_ptr<X509, CertFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;

constexpr auto kCaValidity = std::chrono::hours(24 * 3650);
// Clients whose clock is a little behind still accept a leaf minted just now.
constexpr auto kBackdate = std::chrono::hours(1);

// The last OpenSSL error queue entries, for messages.
std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no details" : out;
}

Error SslError(const std::string& what) {
  return MakeError(ErrorCode::kInternal, what + ": " + OpenSslErrors());
}

Result<KeyPtr> NewP256Key() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return SslError("generating an ECDSA P-256 key");
  return key;
}

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(ErrorCode::kIo, "cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes content to path through a temp file and a rename, with the given mode from the start.
Status WriteFileAtomic(const std::string& path, const std::string& content, mode_t mode) {
  std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0)
    return MakeError(ErrorCode::kIo, "cannot create " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return MakeError(ErrorCode::kIo, "cannot write " + tmp + ": " + err);
    }
    done += static_cast<size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return MakeError(ErrorCode::kIo, "cannot write " + path + ": " + err);
  }
  return Ok();
}

Result<std::string> KeyToPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return SslError("encoding a private key");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  std::string pem(data, static_cast<size_t>(n));
  // The key's PEM is in a BIO buffer that is freed now; overwrite it first.
  OPENSSL_cleanse(data, static_cast<size_t>(n));
  return pem;
}

Result<std::string> CertToPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return SslError("encoding a certificate");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

Result<KeyPtr> ParseKey(const std::string& pem, const std::string& path) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  KeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!key) {
    ERR_clear_error();
    return MakeError(ErrorCode::kInvalidArgument, path + " holds no PEM private key");
  }
  return key;
}

Result<CertPtr> ParseCert(const std::string& pem, const std::string& path) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  CertPtr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) {
    ERR_clear_error();
    return MakeError(ErrorCode::kInvalidArgument, path + " holds no PEM certificate");
  }
  return cert;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return SslError("building certificate extension " + value);
  int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return SslError("adding certificate extension " + value);
  return Ok();
}

// A certificate for key with a random 127-bit serial, valid from now - kBackdate for validity,
// with subject CN = common_name; the issuer name is issuer's subject (or its own when issuer is
// null). Extensions are added by the caller before signing.
Result<CertPtr> NewCert(EVP_PKEY* key, X509* issuer, const std::string& common_name,
                        std::chrono::seconds validity) {
  CertPtr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) return SslError("creating a certificate");
  BIGNUM* serial = BN_new();
  bool ok = serial && BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
            BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(serial);
  if (!ok) return SslError("choosing a certificate serial");
  long backdate = std::chrono::duration_cast<std::chrono::seconds>(kBackdate).count();
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), -backdate) ||
      !X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(validity.count())) ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return SslError("setting certificate validity and key");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1 ||
      X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name) != 1) {
    return SslError("setting certificate names");
  }
  return cert;
}

std::string NodeName() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "node";
  return host;
}

Result<std::pair<KeyPtr, CertPtr>> CreateCa(const std::string& common_name) {
  auto key = NewP256Key();
  if (!key) return key.error();
  auto cert = NewCert(key.value().get(), nullptr,
                      common_name.empty() ? "shoal node CA (" + NodeName() + ")" : common_name,
                      std::chrono::duration_cast<std::chrono::seconds>(kCaValidity));
  if (!cert) return cert.error();
  X509* c = cert.value().get();
  const std::pair<int, std::string> extensions[] = {
      {NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
      {NID_key_usage, "critical,keyCertSign,cRLSign"},
      {NID_subject_key_identifier, "hash"},
      {NID_authority_key_identifier, "keyid:always"}};
  for (const auto& [nid, value] : extensions) {
    if (auto st = AddExtension(c, c, nid, value); !st) return st.error();
  }
  if (X509_sign(c, key.value().get(), EVP_sha256()) <= 0) return SslError("signing the CA");
  return std::make_pair(std::move(key.value()), std::move(cert.value()));
}

}  // namespace

struct NodeCa::Impl {
  KeyPtr key;
  CertPtr cert;
};

struct NodeCa::Leaf {
  std::shared_ptr<ssl::context> context;
  std::string cert_pem;
  std::chrono::system_clock::time_point not_after;
};

NodeCa::NodeCa(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeCa::~NodeCa() = default;

Result<std::unique_ptr<NodeCa>> NodeCa::Load(const std::string& cert_file,
                                             const std::string& key_file) {
  auto cert_pem = ReadWholeFile(cert_file);
  if (!cert_pem) return cert_pem.error();
  auto key_pem = ReadWholeFile(key_file);
  if (!key_pem) return key_pem.error();
  auto cert = ParseCert(cert_pem.value(), cert_file);
  if (!cert) return cert.error();
  auto key = ParseKey(key_pem.value(), key_file);
  OPENSSL_cleanse(key_pem.value().data(), key_pem.value().size());
  if (!key) return key.error();
  if (X509_check_private_key(cert.value().get(), key.value().get()) != 1) {
    ERR_clear_error();
    return MakeError(ErrorCode::kInvalidArgument,
                     "the key in " + key_file + " does not belong to the certificate " + cert_file);
  }
  if (X509_check_ca(cert.value().get()) == 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     cert_file + " is not a CA certificate (basicConstraints CA:TRUE missing)");
  }
  struct stat st {};
  if (::stat(key_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    spdlog::warn("CA key {} is readable by group or others (mode {:o}); make it 0600",
                 key_file, st.st_mode & 0777);
  }
  auto impl = std::make_unique<Impl>();
  impl->key = std::move(key.value());
  impl->cert = std::move(cert.value());
  std::unique_ptr<NodeCa> ca(new NodeCa(std::move(impl)));
  auto pem = CertToPem(ca->impl_->cert.get());
  if (!pem) return pem.error();
  ca->cert_pem_ = std::move(pem.value());
  return ca;
}

Result<std::unique_ptr<NodeCa>> NodeCa::LoadOrCreate(const std::string& dir,
                                                     const std::string& common_name) {
  const std::string cert_file = dir + "/ca.crt";
  const std::string key_file = dir + "/ca.key";
  std::error_code ec;
  bool has_cert = std::filesystem::exists(cert_file, ec);
  bool has_key = std::filesystem::exists(key_file, ec);
  if (has_cert && has_key) return Load(cert_file, key_file);
  if (has_cert || has_key) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "found " + (has_cert ? cert_file : key_file) + " without " +
                         (has_cert ? key_file : cert_file) +
                         "; remove it to create a new CA (clients must then trust the new "
                         "certificate)");
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) return MakeError(ErrorCode::kIo, "cannot create " + dir + ": " + ec.message());
  if (::chmod(dir.c_str(), 0700) != 0)
    return MakeError(ErrorCode::kIo, "cannot chmod " + dir + ": " + std::strerror(errno));
  auto created = CreateCa(common_name);
  if (!created) return created.error();
  auto key_pem = KeyToPem(created.value().first.get());
  if (!key_pem) return key_pem.error();
  auto cert_pem = CertToPem(created.value().second.get());
  if (!cert_pem) return cert_pem.error();
  // The key first: a certificate without its key is useless, and Load checks the pair.
  Status wrote = WriteFileAtomic(key_file, key_pem.value(), 0600);
  OPENSSL_cleanse(key_pem.value().data(), key_pem.value().size());
  if (!wrote) return wrote.error();
  if (auto st = WriteFileAtomic(cert_file, cert_pem.value(), 0644); !st) return st.error();
  spdlog::info("created the CA {} (key {}, mode 0600)", cert_file, key_file);
  auto impl = std::make_unique<Impl>();
  impl->key = std::move(created.value().first);
  impl->cert = std::move(created.value().second);
  std::unique_ptr<NodeCa> ca(new NodeCa(std::move(impl)));
  ca->cert_pem_ = std::move(cert_pem.value());
  return ca;
}

namespace {

// A leaf signed by ca_cert/ca_key: CN = common_name, SAN = san ("DNS:..." or "IP:..."), the
// given extended key usage, valid for `validity`, with a new P-256 key.
Result<std::pair<KeyPtr, CertPtr>> MintLeaf(X509* ca_cert, EVP_PKEY* ca_key,
                                            const std::string& common_name, const std::string& san,
                                            const std::string& ext_key_usage,
                                            std::chrono::seconds validity) {
  auto key = NewP256Key();
  if (!key) return key.error();
  auto cert = NewCert(key.value().get(), ca_cert, common_name, validity);
  if (!cert) return cert.error();
  X509* c = cert.value().get();
  const std::pair<int, std::string> extensions[] = {{NID_basic_constraints, "critical,CA:FALSE"},
                                                    {NID_key_usage, "critical,digitalSignature"},
                                                    {NID_ext_key_usage, ext_key_usage},
                                                    {NID_subject_alt_name, san},
                                                    {NID_authority_key_identifier, "keyid:always"}};
  for (const auto& [nid, value] : extensions) {
    if (auto st = AddExtension(c, ca_cert, nid, value); !st) return st.error();
  }
  if (X509_sign(c, ca_key, EVP_sha256()) <= 0)
    return SslError("signing the leaf certificate for " + common_name);
  return std::make_pair(std::move(key.value()), std::move(cert.value()));
}

}  // namespace

Result<const NodeCa::Leaf*> NodeCa::LeafFor(const std::string& host) {
  const auto now = std::chrono::system_clock::now();
  auto it = leaves_.find(host);
  if (it != leaves_.end() && it->second->not_after - now > std::chrono::hours(24))
    return it->second.get();

  boost::system::error_code ip_ec;
  boost::asio::ip::make_address(host, ip_ec);
  auto minted = MintLeaf(impl_->cert.get(), impl_->key.get(), host,
                         (ip_ec ? "DNS:" : "IP:") + host, "serverAuth",
                         std::chrono::duration_cast<std::chrono::seconds>(kLeafValidity));
  if (!minted) return minted.error();
  X509* c = minted.value().second.get();
  EVP_PKEY* key = minted.value().first.get();

  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  SSL_CTX* native = context->native_handle();
  if (SSL_CTX_use_certificate(native, c) != 1 || SSL_CTX_use_PrivateKey(native, key) != 1 ||
      SSL_CTX_add1_chain_cert(native, impl_->cert.get()) != 1) {
    return SslError("building the TLS context for " + host);
  }
  auto pem = CertToPem(c);
  if (!pem) return pem.error();
  auto leaf = std::make_unique<Leaf>();
  leaf->context = std::move(context);
  leaf->cert_pem = std::move(pem.value());
  leaf->not_after = now + kLeafValidity;
  const Leaf* out = leaf.get();
  leaves_[host] = std::move(leaf);
  spdlog::debug("minted a proxy leaf certificate for {}", host);
  return out;
}

Result<NodeCa::IssuedLeaf> NodeCa::IssueLeaf(const std::string& common_name,
                                             const std::string& dns_name,
                                             std::chrono::seconds validity) {
  auto minted = MintLeaf(impl_->cert.get(), impl_->key.get(), common_name, "DNS:" + dns_name,
                         "serverAuth,clientAuth", validity);
  if (!minted) return minted.error();
  auto cert_pem = CertToPem(minted.value().second.get());
  if (!cert_pem) return cert_pem.error();
  auto key_pem = KeyToPem(minted.value().first.get());
  if (!key_pem) return key_pem.error();
  return IssuedLeaf{std::move(cert_pem.value()), std::move(key_pem.value()),
                    std::chrono::system_clock::now() + validity};
}

Result<std::shared_ptr<ssl::context>> NodeCa::ServerContext(const std::string& host) {
  auto leaf = LeafFor(host);
  if (!leaf) return leaf.error();
  return leaf.value()->context;
}

Result<std::string> NodeCa::LeafCertPem(const std::string& host) {
  auto leaf = LeafFor(host);
  if (!leaf) return leaf.error();
  return leaf.value()->cert_pem;
}

Result<std::string> ReadCertPemFile(const std::string& file) {
  auto pem = ReadWholeFile(file);
  if (!pem) return pem.error();
  auto cert = ParseCert(pem.value(), file);
  if (!cert) return cert.error();
  return CertToPem(cert.value().get());
}

}  // namespace shoal::tls
