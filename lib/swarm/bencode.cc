#include "lib/swarm/bencode.h"

#include <cstdlib>
#include <iterator>
#include <utility>

#include <spdlog/spdlog.h>
#include <libtorrent/bencode.hpp>
#include <libtorrent/entry.hpp>

namespace shoal::swarm {

struct Bencode::Impl {
  libtorrent::entry entry;
  // impl's dictionary; terminates when impl is null or not a dictionary (a bug in the caller).
  static libtorrent::entry::dictionary_type& DictOf(Impl* impl);
};

namespace {

[[noreturn]] void Misuse(const char* what) {
  spdlog::critical("bencode: {} (a bug in the caller)", what);
  std::abort();
}

}  // namespace

libtorrent::entry::dictionary_type& Bencode::Impl::DictOf(Impl* impl) {
  if (!impl || impl->entry.type() != libtorrent::entry::dictionary_t)
    Misuse("Set on a value that is not a dictionary");
  return impl->entry.dict();
}

Bencode::Bencode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bencode::Bencode(Bencode&&) noexcept = default;
Bencode& Bencode::operator=(Bencode&&) noexcept = default;
Bencode::~Bencode() = default;

Bencode Bencode::Int(int64_t value) {
  auto impl = std::make_unique<Impl>();
  impl->entry = libtorrent::entry(libtorrent::entry::integer_type{value});
  return Bencode(std::move(impl));
}

Bencode Bencode::String(std::string_view bytes) {
  auto impl = std::make_unique<Impl>();
  impl->entry = libtorrent::entry(libtorrent::entry::string_type(bytes));
  return Bencode(std::move(impl));
}

Bencode Bencode::List() {
  auto impl = std::make_unique<Impl>();
  impl->entry = libtorrent::entry(libtorrent::entry::list_t);
  return Bencode(std::move(impl));
}

Bencode Bencode::Dict() {
  auto impl = std::make_unique<Impl>();
  impl->entry = libtorrent::entry(libtorrent::entry::dictionary_t);
  return Bencode(std::move(impl));
}

Bencode& Bencode::Set(std::string_view key, Bencode value) {
  Impl::DictOf(impl_.get())[std::string(key)] = std::move(value.impl_->entry);
  return *this;
}

// The two scalar Sets write into the dictionary directly: no wrapper is allocated per value, so
// a tracker reply of six keys costs six map nodes and nothing else.
Bencode& Bencode::Set(std::string_view key, int64_t value) {
  Impl::DictOf(impl_.get())[std::string(key)] = libtorrent::entry::integer_type{value};
  return *this;
}

Bencode& Bencode::Set(std::string_view key, std::string_view bytes) {
  libtorrent::entry& value = Impl::DictOf(impl_.get())[std::string(key)];
  if (value.type() == libtorrent::entry::string_t) {
    value.string().assign(bytes);  // keeps the capacity of a dictionary that is reused
  } else {
    value = libtorrent::entry::string_type(bytes);
  }
  return *this;
}

Bencode& Bencode::Erase(std::string_view key) {
  auto& dict = Impl::DictOf(impl_.get());
  if (auto it = dict.find(key); it != dict.end()) dict.erase(it);
  return *this;
}

Bencode& Bencode::Append(Bencode value) {
  if (!impl_ || impl_->entry.type() != libtorrent::entry::list_t)
    Misuse("Append on a value that is not a list");
  impl_->entry.list().push_back(std::move(value.impl_->entry));
  return *this;
}

std::string Bencode::Encode() const {
  std::string out;
  if (!impl_) Misuse("Encode on a moved-from value");
  out.reserve(128);
  libtorrent::bencode(std::back_inserter(out), impl_->entry);
  return out;
}

}  // namespace shoal::swarm
