#include "agent/seed_book.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "lib/core/base64.h"

namespace shoal::agent {
namespace fs = std::filesystem;
using boost::asio::awaitable;
using nlohmann::json;

namespace {

json ToJson(const SeedEntry& e) {
  json chunks = json::array();
  for (const auto& m : e.metainfo) chunks.push_back(Base64Encode(m));
  return json{{"digest", e.digest.str()},
              {"size", e.layout.blob_size},
              {"chunk_size", e.layout.chunk_size},
              {"piece_size", e.layout.piece_size},
              {"first_chunk_size", e.layout.first_chunk_size},
              {"registry", e.source.registry},
              {"repository", e.source.repository},
              {"chunks", chunks}};
}

Result<SeedEntry> FromJson(const std::string& text) {
  try {
    json j = json::parse(text);
    auto digest = Digest::Parse(j.at("digest").get<std::string>());
    if (!digest) return digest.error();
    SeedEntry e{digest.value(), {}, {}, {}};
    e.layout.blob_size = j.at("size").get<uint64_t>();
    e.layout.chunk_size = j.at("chunk_size").get<uint64_t>();
    e.layout.piece_size = j.at("piece_size").get<uint32_t>();
    e.layout.first_chunk_size = j.value("first_chunk_size", uint64_t{0});
    if (auto st = e.layout.Validate(); !st) return st.error();
    e.source = BlobSource{e.layout.blob_size, j.at("registry").get<std::string>(),
                          j.at("repository").get<std::string>()};
    for (const auto& c : j.at("chunks")) {
      auto m = Base64Decode(c.get<std::string>());
      if (!m) return MakeError(ErrorCode::kInvalidArgument, "chunk metainfo is not base64");
      e.metainfo.push_back(std::move(*m));
    }
    if (e.metainfo.size() != e.layout.chunk_count())
      return MakeError(ErrorCode::kInvalidArgument, "wrong chunk count");
    return e;
  } catch (const std::exception& ex) {
    return MakeError(ErrorCode::kInvalidArgument, ex.what());
  }
}

}  // namespace

SeedBook::SeedBook(std::string dir, store::BlobStore& store, swarm::Swarm& swarm,
                   TrackerClient* tracker)
    : dir_(std::move(dir)), store_(store), swarm_(swarm), tracker_(tracker) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) spdlog::warn("cannot create seed directory {}: {}", dir_, ec.message());
}

std::string SeedBook::PathOf(const std::string& hex) const { return dir_ + "/" + hex + ".json"; }

void SeedBook::Add(SeedEntry entry) {
  std::string hex = entry.digest.hex();
  std::string path = PathOf(hex), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << ToJson(entry).dump();
    if (!out.flush()) spdlog::warn("cannot write {}", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) spdlog::warn("cannot rename {}: {}", tmp, ec.message());
  entries_.insert_or_assign(hex, std::move(entry));
}

Status SeedBook::Seed(const SeedEntry& entry) {
  auto fd = store_.OpenBlob(entry.digest);
  if (!fd) return fd.error();
  auto adopted = swarm::BlobFile::Adopt(fd.value());
  if (!adopted) return adopted.error();
  auto file = adopted.value();
  for (uint32_t k = 0; k < entry.layout.chunk_count(); ++k) {
    auto torrent = swarm::ParseChunkTorrent(entry.metainfo[k], entry.layout.chunk_length(k),
                                            entry.layout.piece_size_of(k), swarm_.root_cert());
    if (!torrent) return torrent.error();
    swarm::ChunkSpec spec;
    spec.torrent = std::move(torrent.value());
    spec.range = swarm::FileRange{file, entry.layout.chunk_begin(k), entry.layout.chunk_length(k)};
    spec.seed = true;
    if (tracker_ != nullptr) spec.tracker_urls = tracker_->AnnounceUrls(entry.digest);
    auto added = swarm_.AddChunk(std::move(spec));
    if (!added) return added.error();
  }
  return Ok();
}

void SeedBook::Forget(const Digest& digest) {
  auto it = entries_.find(digest.hex());
  if (it == entries_.end()) return;
  const SeedEntry& entry = it->second;
  for (uint32_t k = 0; k < entry.metainfo.size(); ++k) {
    auto torrent = swarm::ParseChunkTorrent(entry.metainfo[k], entry.layout.chunk_length(k),
                                            entry.layout.piece_size_of(k), swarm_.root_cert());
    if (torrent) swarm_.RemoveChunk(torrent.value().info_hash);
  }
  std::error_code ec;
  fs::remove(PathOf(it->first), ec);
  entries_.erase(it);
}

size_t SeedBook::Restore() {
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir_, ec)) {
    const fs::path& p = de.path();
    if (p.extension() != ".json") {
      fs::remove(p, ec);  // a .tmp from an interrupted write
      continue;
    }
    std::ifstream in(p);
    std::stringstream text;
    text << in.rdbuf();
    auto entry = FromJson(text.str());
    Status st = entry ? Seed(entry.value()) : Status(entry.error());
    if (!st) {
      spdlog::info("not seeding {}: {}", p.filename().string(), st.error().message);
      fs::remove(p, ec);
      continue;
    }
    entries_.insert_or_assign(entry.value().digest.hex(), std::move(entry.value()));
  }
  return entries_.size();
}

void SeedBook::AddPartial(const Digest& digest, const BlobSource& source, uint32_t k,
                          std::string metainfo) {
  auto [it, added] = partials_.try_emplace(digest.hex(), Partial{digest, source, {}});
  it->second.metainfo[k] = std::move(metainfo);
}

void SeedBook::DropPartial(const Digest& digest) { partials_.erase(digest.hex()); }

awaitable<void> SeedBook::RepublishAll() {
  if (tracker_ == nullptr || !tracker_->enabled()) co_return;
  if (republishing_) {  // a second restart while publishing: go round once more
    republish_again_ = true;
    co_return;
  }
  republishing_ = true;
  do {
    republish_again_ = false;
    // Copy what to publish: entries_ and partials_ may change while we are suspended.
    struct Item {
      Digest digest;
      BlobSource source;
      uint32_t k;
      std::string metainfo;
    };
    std::vector<Item> items;
    for (const auto& [hex, e] : entries_) {
      for (uint32_t k = 0; k < e.metainfo.size(); ++k) {
        items.push_back({e.digest, e.source, k, e.metainfo[k]});
      }
    }
    size_t partial = 0;
    for (const auto& [hex, p] : partials_) {
      if (entries_.count(hex) != 0) continue;  // committed meanwhile: published above
      for (const auto& [k, metainfo] : p.metainfo) items.push_back({p.digest, p.source, k, metainfo});
      partial += p.metainfo.size();
    }
    size_t published = 0, failed = 0;
    const std::string no_lease;
    for (const Item& item : items) {
      Status st =
          co_await tracker_->Publish(item.digest, item.k, item.source, no_lease, item.metainfo);
      if (st) {
        ++published;
      } else {
        ++failed;
      }
    }
    spdlog::info("re-published {} chunks to the tracker ({} failed; {} of blobs still downloading)",
                 published, failed, partial);
  } while (republish_again_);
  republishing_ = false;
}

}  // namespace shoal::agent
