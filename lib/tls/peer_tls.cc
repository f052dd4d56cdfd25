#include "lib/tls/peer_tls.h"

#include <memory>

#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/pem.h>

#include "lib/tls/node_ca.h"

namespace shoal::tls {

Result<std::string> DhParamsPem() {
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_from_name(nullptr, "DH", nullptr), EVP_PKEY_CTX_free);
  char group[] = "ffdhe2048";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, group, 0),
                         OSSL_PARAM_construct_end()};
  EVP_PKEY* raw = nullptr;
  if (!ctx || EVP_PKEY_paramgen_init(ctx.get()) != 1 ||
      EVP_PKEY_CTX_set_params(ctx.get(), params) != 1 ||
      EVP_PKEY_paramgen(ctx.get(), &raw) != 1) {
    ERR_clear_error();
    return MakeError(ErrorCode::kInternal, "OpenSSL cannot make the ffdhe2048 DH parameters");
  }
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(raw, EVP_PKEY_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || PEM_write_bio_Parameters(bio.get(), key.get()) != 1) {
    ERR_clear_error();
    return MakeError(ErrorCode::kInternal, "OpenSSL cannot encode the DH parameters");
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

Result<PeerTls> MintPeerTls(const std::string& ca_cert_file, const std::string& ca_key_file,
                            const std::string& common_name) {
  auto ca = NodeCa::Load(ca_cert_file, ca_key_file);
  if (!ca) return ca.error();
  auto leaf = ca.value()->IssueLeaf(common_name, "*", kPeerCertValidity);
  if (!leaf) return leaf.error();
  auto dh = DhParamsPem();
  if (!dh) return dh.error();
  PeerTls out;
  out.ca_pem = ca.value()->cert_pem();
  out.cert_pem = std::move(leaf.value().cert_pem);
  out.key_pem = std::move(leaf.value().key_pem);
  out.dh_pem = std::move(dh.value());
  out.not_after = leaf.value().not_after;
  return out;
}

}  // namespace shoal::tls
