#pragma once
// Bencoded values (BitTorrent's wire format) built without libtorrent types in the interface;
// encoding is libtorrent's own (lt::entry + lt::bencode), so what we send is what it parses.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace shoal::swarm {

// One bencode value: an integer, a byte string, a list or a dictionary (keys sorted on
// encoding). Movable, not copyable; not thread-safe (one owner at a time).
class Bencode {
 public:
  // Factories for the four kinds.
  static Bencode Int(int64_t value);
  static Bencode String(std::string_view bytes);  // any bytes, not only text
  static Bencode List();
  static Bencode Dict();

  Bencode(Bencode&&) noexcept;
  Bencode& operator=(Bencode&&) noexcept;
  ~Bencode();

  // Sets key to value in a dictionary, replacing an earlier value; returns *this for chaining.
  // Calling it on a non-dictionary is a bug (it terminates).
  Bencode& Set(std::string_view key, Bencode value);
  Bencode& Set(std::string_view key, int64_t value);
  Bencode& Set(std::string_view key, std::string_view bytes);
  // Removes key from a dictionary (nothing when absent); a bug on a non-dictionary, as Set.
  Bencode& Erase(std::string_view key);
  // Appends to a list; calling it on a non-list is a bug (it terminates).
  Bencode& Append(Bencode value);

  // The bencoded bytes.
  std::string Encode() const;

 private:
  struct Impl;
  explicit Bencode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal::swarm
