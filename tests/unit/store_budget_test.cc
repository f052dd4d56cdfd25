// The blob store's budget: LRU eviction among unpinned blobs that are not in use, pins with
// owners and expiry, and what survives a reopen.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "lib/core/sha256.h"
#include "lib/store/blob_store.h"

#include "tests/support/why.h"

namespace shoal::store {
namespace fs = std::filesystem;

namespace {
struct TempRoot {
  std::string path;
  TempRoot() {
    char tmpl[] = "/tmp/shoal-budget-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempRoot() { fs::remove_all(path); }
};

// A fake wall clock the test moves by hand.
struct FakeClock {
  std::chrono::system_clock::time_point now =
      std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 50));
  void Advance(std::chrono::seconds s) { now += s; }
};

// Stores `size` bytes of `fill` as a committed blob and returns its digest.
Digest PutBlob(BlobStore& store, char fill, size_t size) {
  std::string data(size, fill);
  Digest d = Sha256::Of(data);
  auto w = store.Create(d).value();
  REQUIRE(w->PWrite(data.data(), data.size(), 0).has_value());
  REQUIRE(w->Commit().has_value());
  return d;
}

std::unique_ptr<BlobStore> OpenWithClock(const std::string& root, FakeClock& clock) {
  auto store = BlobStore::Open(root).value();
  store->SetClock([&clock] { return clock.now; });
  return store;
}

bool Contains(const std::vector<Digest>& v, const Digest& d) {
  return std::find(v.begin(), v.end(), d) != v.end();
}
}  // namespace

TEST_CASE("store budget: parses bytes, units and percentages of the file system") {
  TempRoot root;
  CHECK(ParseBudget("1048576", root.path).value() == 1048576);
  CHECK(ParseBudget("50GiB", root.path).value() == 50ull << 30);
  CHECK(ParseBudget("512MiB", root.path).value() == 512ull << 20);
  CHECK(ParseBudget("10GB", root.path).value() == 10'000'000'000ull);
  CHECK(ParseBudget("0", root.path).value() == 0);
  auto pct = ParseBudget("80%", root.path);
  REQUIRE(pct.has_value());
  CHECK(pct.value() > 0);
  CHECK(ParseBudget("100%", root.path).value() >= pct.value());
  CHECK_FALSE(ParseBudget("lots", root.path).has_value());
  CHECK_FALSE(ParseBudget("5 parsecs", root.path).has_value());
  CHECK_FALSE(ParseBudget("150%", root.path).has_value());
}

TEST_CASE("store budget: evicts the least recently used blob first") {
  TempRoot root;
  FakeClock clock;
  auto store = OpenWithClock(root.path, clock);
  Digest a = PutBlob(*store, 'a', 1000);
  clock.Advance(std::chrono::seconds(1));
  Digest b = PutBlob(*store, 'b', 1000);
  clock.Advance(std::chrono::seconds(1));
  Digest c = PutBlob(*store, 'c', 1000);
  clock.Advance(std::chrono::seconds(1));
  // Reading a makes b the least recently used.
  store->Touch(a);
  CHECK(store->Stats().bytes == 3000);
  store->SetBudget(2500);
  EvictReport r = store->Evict();
  CHECK(r.freed_bytes == 1000);
  REQUIRE(r.evicted.size() == 1);
  CHECK(r.evicted[0] == b);
  CHECK_FALSE(store->Stat(b).has_value());
  CHECK(store->Stat(a).has_value());
  CHECK(store->Stat(c).has_value());
  CHECK(store->Stats().bytes == 2000);
  CHECK(store->Stats().evictions == 1);
  // Within budget: nothing more goes.
  CHECK(store->Evict().evicted.empty());
  // No budget: nothing goes.
  store->SetBudget(0);
  CHECK(store->Evict().evicted.empty());
}

TEST_CASE("store budget: pinned blobs and blobs in use are never evicted") {
  TempRoot root;
  FakeClock clock;
  auto store = OpenWithClock(root.path, clock);
  Digest a = PutBlob(*store, 'a', 1000);
  clock.Advance(std::chrono::seconds(1));
  Digest b = PutBlob(*store, 'b', 1000);
  clock.Advance(std::chrono::seconds(1));
  Digest c = PutBlob(*store, 'c', 1000);
  REQUIRE(store->Pin(a, "prefetch", "img:1", std::nullopt).has_value());
  auto reading = store->MarkInUse(b);
  CHECK(store->InUse(b));
  EvictReport r = store->EvictTo(0);
  CHECK(Contains(r.evicted, c));
  CHECK_FALSE(Contains(r.evicted, a));
  CHECK_FALSE(Contains(r.evicted, b));
  CHECK(r.over_budget == 2000);
  CHECK(store->Stat(a).has_value());
  CHECK(store->Stat(b).has_value());
  CHECK(store->Stats().pinned_bytes == 1000);
  reading.reset();
  CHECK_FALSE(store->InUse(b));
  r = store->EvictTo(0);
  CHECK(r.evicted == std::vector<Digest>{b});
  CHECK(store->Stat(a).has_value());
}

TEST_CASE("store budget: a blob is in use while it is written and evictable once committed") {
  TempRoot root;
  auto store = BlobStore::Open(root.path).value();
  std::string data(100, 'w');
  Digest d = Sha256::Of(data);
  auto w = store->Create(d).value();
  REQUIRE(w->PWrite(data.data(), data.size(), 0).has_value());
  CHECK(store->InUse(d));
  CHECK(store->Stats().bytes == 0);  // still in tmp/: not a cache entry yet
  CHECK(store->EvictTo(0).evicted.empty());
  REQUIRE(w->Commit().has_value());
  // The writer may live on (its torrents seed from its fd); readers hold their own handles.
  CHECK_FALSE(store->InUse(d));
  auto reader = store->MarkInUse(d);
  CHECK(store->EvictTo(0).evicted.empty());
  reader.reset();
  CHECK(store->EvictTo(0).evicted == std::vector<Digest>{d});
  w.reset();
  CHECK_FALSE(store->InUse(d));
}

TEST_CASE("store budget: pins expire after their TTL and unpin removes one owner or all") {
  TempRoot root;
  FakeClock clock;
  auto store = OpenWithClock(root.path, clock);
  Digest a = PutBlob(*store, 'a', 10);
  REQUIRE(store->Pin(a, "prefetch", "", std::chrono::seconds(60)).has_value());
  REQUIRE(store->Pin(a, "operator", "keep", std::nullopt).has_value());
  CHECK(store->Pins()[a].size() == 2);
  CHECK(store->Unpin(a, "operator").value() == 1);
  CHECK(store->IsPinned(a));
  clock.Advance(std::chrono::seconds(61));
  CHECK_FALSE(store->IsPinned(a));
  CHECK(store->Pins().empty());
  CHECK(store->EvictTo(0).evicted == std::vector<Digest>{a});

  Digest b = PutBlob(*store, 'b', 10);
  REQUIRE(store->Pin(b, std::nullopt).has_value());
  REQUIRE(store->Pin(b, "prefetch", "", std::nullopt).has_value());
  CHECK(store->Unpin(b).value() == 2);
  CHECK_FALSE(store->IsPinned(b));
  CHECK(store->Unpin(b).value() == 0);
}

TEST_CASE("store budget: expired pins leave pins.json at the next Flush, not inside Evict") {
  TempRoot root;
  FakeClock clock;
  auto store = OpenWithClock(root.path, clock);
  auto pins_file = [&] {
    std::ifstream in(root.path + "/pins.json");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  Digest brief = Sha256::Of(std::string("brief")), kept = Sha256::Of(std::string("kept"));
  REQUIRE(store->Pin(brief, "prefetch", "", std::chrono::seconds(60)).has_value());
  REQUIRE(store->Pin(kept, "operator", "", std::nullopt).has_value());
  CHECK(pins_file().find(brief.str()) != std::string::npos);  // Pin saves at once
  clock.Advance(std::chrono::seconds(61));
  // Evict runs on the agent's network thread: it drops the pin in memory and writes nothing.
  CHECK(store->Evict().evicted.empty());
  CHECK_FALSE(store->IsPinned(brief));
  CHECK(pins_file().find(brief.str()) != std::string::npos);
  REQUIRE(store->Flush().has_value());
  CHECK(pins_file().find(brief.str()) == std::string::npos);
  CHECK(pins_file().find(kept.str()) != std::string::npos);
  // What Flush wrote reads back (a reopen with the clock before the old expiry keeps it gone).
  clock.now -= std::chrono::seconds(61);
  auto reopened = OpenWithClock(root.path, clock);
  CHECK_FALSE(reopened->IsPinned(brief));
  CHECK(reopened->IsPinned(kept));
}

TEST_CASE("store budget: pins, sizes and last use survive a reopen") {
  TempRoot root;
  FakeClock clock;
  Digest a = Sha256::Of(std::string("x")), b = a, pinned_absent = Sha256::Of(std::string("later"));
  {
    auto store = OpenWithClock(root.path, clock);
    a = PutBlob(*store, 'a', 100);
    clock.Advance(std::chrono::seconds(10));
    b = PutBlob(*store, 'b', 200);
    clock.Advance(std::chrono::seconds(10));
    store->Touch(a);  // a is now the most recently used
    REQUIRE(store->Pin(pinned_absent, "prefetch", "img", std::chrono::seconds(3600)).has_value());
    REQUIRE(store->Flush().has_value());
  }
  auto store = OpenWithClock(root.path, clock);
  CHECK(store->Stats().bytes == 300);
  CHECK(store->IsPinned(pinned_absent));
  auto list = store->List();
  REQUIRE(list.size() == 2);
  CHECK(list[0].digest == b);  // least recently used first
  CHECK(list[1].digest == a);
  CHECK(store->EvictTo(150).evicted == std::vector<Digest>{b});
}

TEST_CASE("store budget: the evict hook runs before the file goes") {
  TempRoot root;
  auto store = BlobStore::Open(root.path).value();
  Digest a = PutBlob(*store, 'a', 10);
  bool existed = false;
  store->SetEvictHook([&](const Digest& d) { existed = store->Stat(d).has_value(); });
  CHECK(store->EvictTo(0).evicted == std::vector<Digest>{a});
  CHECK(existed);
  CHECK_FALSE(fs::exists(store->BlobPath(a)));
}

TEST_CASE("store budget: a cached manifest counts toward the cache and can be evicted") {
  TempRoot root;
  auto store = BlobStore::Open(root.path).value();
  std::string body = R"({"schemaVersion":2})";
  Digest d = Sha256::Of(body);
  REQUIRE(store->PutManifest(d, body, "application/vnd.oci.image.manifest.v1+json").has_value());
  CHECK(store->Stats().bytes == body.size());
  CHECK(store->EvictTo(0).evicted == std::vector<Digest>{d});
  CHECK_FALSE(store->GetManifest(d).has_value());
}

}  // namespace shoal::store

namespace shoal::store {

// Issue 13, defect 3: eviction ran only after a commit, so a blob that needed the room of an
// old one failed with ENOSPC, and the temp files of fetches in flight were not counted.
TEST_CASE("store budget: Create makes room for the incoming blob and counts it while in flight") {
  TempRoot root;
  FakeClock clock;
  auto store = OpenWithClock(root.path, clock);
  store->SetBudget(100);
  Digest old = PutBlob(*store, 'a', 60);
  clock.Advance(std::chrono::seconds(1));
  Digest pinned = PutBlob(*store, 'b', 30);
  REQUIRE(store->Pin(pinned, std::nullopt).has_value());

  // 60 + 30 + 50 > 100: the least recently used unpinned blob goes before the write starts.
  std::string data(50, 'c');
  Digest incoming = Sha256::Of(data);
  auto w = store->Create(incoming, data.size());
  REQUIRE_MESSAGE(w.has_value(), Why(w));
  CHECK_FALSE(store->Stat(old).has_value());
  CHECK(store->Stat(pinned).has_value());
  CHECK(store->Stats().evictions == 1);
  CHECK(store->Stats().inflight_bytes == 50);

  // In flight, the 50 bytes count: a second 50-byte blob cannot fit beside them and the pin.
  std::string other(50, 'd');
  auto refused = store->Create(Sha256::Of(other), other.size());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == ErrorCode::kInsufficientStorage);
  CHECK(refused.error().message.find("in flight 50") != std::string::npos);
  CHECK(refused.error().message.find("pinned 30") != std::string::npos);

  // Committed, the bytes move from in flight to cached; an aborted writer gives its share back.
  REQUIRE(w.value()->PWrite(data.data(), data.size(), 0).has_value());
  REQUIRE(w.value()->Commit().has_value());
  CHECK(store->Stats().inflight_bytes == 0);
  CHECK(store->Stats().bytes == 80);
  {
    std::string tiny(10, 'e');
    auto t = store->Create(Sha256::Of(tiny), tiny.size());
    REQUIRE(t.has_value());
    CHECK(store->Stats().inflight_bytes == 10);
  }
  CHECK(store->Stats().inflight_bytes == 0);
  // Larger than the whole budget: refused at once, whatever is evictable.
  auto huge = store->Create(Sha256::Of(std::string("x")), 101);
  REQUIRE_FALSE(huge.has_value());
  CHECK(huge.error().code == ErrorCode::kInsufficientStorage);
  CHECK(fs::is_empty(root.path + "/tmp"));
}

TEST_CASE(
    "store budget: space held outside the cache (extracted layers) counts and blobs make "
    "room for it") {
  TempRoot root;
  FakeClock clock;
  auto store = OpenWithClock(root.path, clock);
  uint64_t layers = 0;
  store->SetExternalUsage([&layers] { return layers; });
  store->SetBudget(100);
  Digest a = PutBlob(*store, 'a', 40);
  clock.Advance(std::chrono::seconds(1));
  Digest b = PutBlob(*store, 'b', 40);
  CHECK(store->Stats().external_bytes == 0);

  // The snapshotter extracted 30 bytes of layers: 40 + 40 + 30 > 100, and the least recently
  // used blob goes; the layers stay.
  layers = 30;
  CHECK(store->Stats().external_bytes == 30);
  EvictReport r = store->Evict();
  CHECK(r.evicted == std::vector<Digest>{a});
  CHECK(r.over_budget == 0);
  CHECK(store->Stat(b).has_value());

  // An incoming blob makes room beside the layers too: 40 + 30 + 40 > 100 evicts b.
  std::string data(40, 'c');
  auto w = store->Create(Sha256::Of(data), data.size());
  REQUIRE_MESSAGE(w.has_value(), Why(w));
  CHECK_FALSE(store->Stat(b).has_value());
  REQUIRE(w.value()->PWrite(data.data(), data.size(), 0).has_value());
  REQUIRE(w.value()->Commit().has_value());

  // Layers alone over the budget: nothing evictable helps; the refusal says what holds it.
  layers = 90;
  std::string more(20, 'd');
  auto refused = store->Create(Sha256::Of(more), more.size());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == ErrorCode::kInsufficientStorage);
  CHECK_MESSAGE(
      refused.error().message.find("extracted layers (snapshotter) 90") != std::string::npos,
      refused.error().message);
  // Refused before evicting anything; an Evict then gives the layers the blob's room.
  CHECK(store->Stats().bytes == 40);
  r = store->Evict();
  CHECK(r.freed_bytes == 40);
  CHECK(r.over_budget == 0);
  // More layers than the budget: over it by the difference, with no blob left to evict.
  layers = 130;
  r = store->Evict();
  CHECK(r.evicted.empty());
  CHECK(r.over_budget == 30);
}

TEST_CASE("store budget: a percentage budget is measured again at each use") {
  TempRoot root;
  auto store = BlobStore::Open(root.path).value();
  REQUIRE(store->SetBudgetSpec("50%").has_value());
  uint64_t half = ParseBudget("50%", root.path).value();
  CHECK(store->Stats().budget == half);
  REQUIRE(store->SetBudgetSpec("10MiB").has_value());
  CHECK(store->Stats().budget == 10ull << 20);
  CHECK_FALSE(store->SetBudgetSpec("ten").has_value());
}

TEST_CASE("store: DropCorrupt removes the blob it was asked about, not a newer copy") {
  TempRoot root;
  auto store = BlobStore::Open(root.path).value();
  Digest d = PutBlob(*store, 'z', 4096);
  struct stat st;
  REQUIRE(::stat(store->BlobPath(d).c_str(), &st) == 0);
  CHECK_FALSE(store->DropCorrupt(d, static_cast<uint64_t>(st.st_ino) + 1));
  CHECK(store->Stat(d).has_value());
  CHECK(store->DropCorrupt(d, static_cast<uint64_t>(st.st_ino)));
  CHECK_FALSE(store->Stat(d).has_value());
  CHECK(store->Stats().bytes == 0);
}

}  // namespace shoal::store
