#include "agent/seed_book.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <spdlog/spdlog.h>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

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

awaitable<void> SeedBook::RepublishAll(std::function<bool(const Digest&)> which,
                                       std::chrono::milliseconds spread) {
  if (tracker_ == nullptr || !tracker_->enabled()) co_return;
  if (republishing_) {  // asked again while publishing: go round once more, for every blob
    republish_again_ = true;
    co_return;
  }
  republishing_ = true;
  if (spread.count() > 0) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
    timer.expires_after(std::chrono::milliseconds(
        std::uniform_int_distribution<int64_t>(0, spread.count() - 1)(rng)));
    boost::system::error_code ec;
    co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  }
  do {
    republish_again_ = false;
    // Copy what to publish, by blob: entries_ and partials_ may change while we are suspended.
    struct Blob {
      Digest digest;
      BlobSource source;
      std::map<uint32_t, std::string> metainfo;  // by chunk index
    };
    std::vector<Blob> blobs;
    size_t partial = 0;
    for (const auto& [hex, e] : entries_) {
      if (which && !which(e.digest)) continue;
      Blob b{e.digest, e.source, {}};
      for (uint32_t k = 0; k < e.metainfo.size(); ++k) b.metainfo[k] = e.metainfo[k];
      blobs.push_back(std::move(b));
    }
    for (const auto& [hex, p] : partials_) {
      if (entries_.count(hex) != 0) continue;  // committed meanwhile: taken above
      if (which && !which(p.digest)) continue;
      blobs.push_back({p.digest, p.source, p.metainfo});
      partial += p.metainfo.size();
    }
    size_t published = 0, failed = 0, known = 0;
    const std::string no_lease;
    for (const Blob& b : blobs) {
      // What the table already has (another agent published it, or it never lost it).
      std::vector<std::string> present;
      auto table = co_await tracker_->FindTable(b.digest);
      if (table) present = std::move(table.value().metainfo);
      for (const auto& [k, metainfo] : b.metainfo) {
        if (k < present.size() && !present[k].empty()) {
          ++known;
          continue;
        }
        Status st = co_await tracker_->Publish(b.digest, k, b.source, no_lease, metainfo);
        if (st) {
          ++published;
        } else {
          ++failed;
        }
      }
    }
    spdlog::info(
        "re-published {} chunks of {} blobs to the tracker ({} already known there, {} failed; {} "
        "of blobs still downloading)",
        published, blobs.size(), known, failed, partial);
    which = {};
  } while (republish_again_);
  republishing_ = false;
}

}  // namespace shoal::agent
