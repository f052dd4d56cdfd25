#include "lib/store/blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lib/core/sha256.h"

namespace shoal::store {
namespace fs = std::filesystem;
namespace {

Error IoError(std::string_view what, const std::string& path, int err) {
  return MakeError(ErrorCode::kIo,
                   std::string(what) + " " + path + ": " + std::strerror(err));
}

Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("open dir", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return IoError("fsync dir", dir, err);
  return Ok();
}

std::string UniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  std::ostringstream s;
  s << ::getpid() << "." << std::hex << (salt ^ counter.fetch_add(1));
  return s.str();
}

// Writes a whole small file to a temp name and renames it into place (fsynced).
Status WriteFileAtomic(const std::string& tmp_dir, const std::string& path,
                       std::string_view content) {
  std::string tmp = tmp_dir + "/small." + UniqueSuffix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("create", tmp, errno);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return IoError("write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return IoError("fsync", tmp, err);
  }
  ::close(fd);
  fs::create_directories(fs::path(path).parent_path());
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return IoError("rename into", path, err);
  }
  return Ok();
}

}  // namespace

BlobWriter::BlobWriter(int fd, std::string temp_path, std::string final_path)
    : fd_(fd), temp_path_(std::move(temp_path)), final_path_(std::move(final_path)) {}

BlobWriter::~BlobWriter() {
  if (!done_) ::unlink(temp_path_.c_str());
  ::close(fd_);
}

Status BlobWriter::PWrite(const char* data, size_t size, uint64_t offset) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("write", temp_path_, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Ok();
}

Status BlobWriter::Commit() {
  if (done_) return MakeError(ErrorCode::kInternal, "commit twice: " + temp_path_);
  if (::fsync(fd_) != 0) return IoError("fsync", temp_path_, errno);
  std::error_code ec;
  fs::create_directories(fs::path(final_path_).parent_path(), ec);
  if (ec) return MakeError(ErrorCode::kIo, "mkdir for " + final_path_ + ": " + ec.message());
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return IoError("rename into", final_path_, errno);
  }
  done_ = true;
  return FsyncDir(fs::path(final_path_).parent_path().string());
}

void BlobWriter::Abort() {
  if (!done_) ::unlink(temp_path_.c_str());
  done_ = true;
}

Result<std::unique_ptr<BlobStore>> BlobStore::Open(std::string root) {
  std::error_code ec;
  for (const char* sub : {"blobs/sha256", "tmp", "meta"}) {
    fs::create_directories(fs::path(root) / sub, ec);
    if (ec) return MakeError(ErrorCode::kIo, "create " + root + "/" + sub + ": " + ec.message());
  }
  std::unique_ptr<BlobStore> store(new BlobStore(root));
  for (const auto& entry : fs::directory_iterator(fs::path(root) / "tmp", ec)) {
    std::error_code rm_ec;
    fs::remove_all(entry.path(), rm_ec);
    if (!rm_ec) ++store->cleaned_temp_files_;
  }
  if (ec) return MakeError(ErrorCode::kIo, "list " + root + "/tmp: " + ec.message());
  return store;
}

std::string BlobStore::BlobPath(const Digest& digest) const {
  const std::string& hex = digest.hex();
  return root_ + "/blobs/sha256/" + hex.substr(0, 2) + "/" + hex;
}

std::optional<uint64_t> BlobStore::Stat(const Digest& digest) const {
  struct stat st;
  if (::stat(BlobPath(digest).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

Result<int> BlobStore::OpenBlob(const Digest& digest) const {
  std::string path = BlobPath(digest);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return MakeError(ErrorCode::kNotFound, "blob not cached: " + digest.str());
    return IoError("open", path, errno);
  }
  return fd;
}

Result<std::unique_ptr<BlobWriter>> BlobStore::Create(const Digest& digest) {
  std::string tmp = root_ + "/tmp/" + digest.hex() + "." + UniqueSuffix() + ".partial";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("create", tmp, errno);
  return std::unique_ptr<BlobWriter>(new BlobWriter(fd, tmp, BlobPath(digest)));
}

Status BlobStore::PutManifest(const Digest& digest, std::string_view body,
                              std::string_view media_type) {
  Digest actual = Sha256::Of(body.data(), body.size());
  if (actual != digest) {
    return MakeError(ErrorCode::kDigestMismatch,
                     "manifest bytes hash to " + actual.str() + ", not " + digest.str());
  }
  nlohmann::json meta = {{"mediaType", media_type}, {"size", body.size()}};
  auto st = WriteFileAtomic(root_ + "/tmp", root_ + "/meta/" + digest.hex() + ".json", meta.dump());
  if (!st) return st;
  return WriteFileAtomic(root_ + "/tmp", BlobPath(digest), body);
}

std::optional<StoredManifest> BlobStore::GetManifest(const Digest& digest) const {
  std::ifstream meta_in(root_ + "/meta/" + digest.hex() + ".json");
  std::ifstream body_in(BlobPath(digest), std::ios::binary);
  if (!meta_in || !body_in) return std::nullopt;
  auto meta = nlohmann::json::parse(meta_in, nullptr, false);
  if (meta.is_discarded() || !meta.contains("mediaType") || !meta["mediaType"].is_string()) {
    return std::nullopt;
  }
  std::ostringstream body;
  body << body_in.rdbuf();
  StoredManifest m{body.str(), meta["mediaType"].get<std::string>()};
  if (Sha256::Of(m.body) != digest) return std::nullopt;
  return m;
}

}  // namespace shoal::store
