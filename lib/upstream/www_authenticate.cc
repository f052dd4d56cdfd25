#include "lib/upstream/www_authenticate.h"

namespace shoal::upstream {
namespace {

constexpr size_t kMaxHeader = 16 * 1024;
constexpr size_t kMaxItems = 64;

// RFC 9110 tchar.
bool IsTchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
    case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken68Char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~' || c == '+' || c == '/';
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  Result<std::vector<Challenge>> Parse() {
    std::vector<Challenge> out;
    size_t items = 0;
    while (true) {
      SkipListSeparators();
      if (AtEnd()) break;
      if (++items > kMaxItems) return Fail("has too many challenges or parameters");
      Challenge c;
      std::string_view scheme = Token();
      if (scheme.empty()) return Fail("expected an auth scheme");
      c.scheme = Lower(scheme);
      bool had_space = SkipSpaces();
      if (!AtEnd() && Peek() != ',') {
        if (!had_space) return Fail("expected a space after the auth scheme");
        if (LooksLikeToken68()) {
          c.token68 = std::string(Token68());
        } else {
          // auth-params until something that is not "token BWS =" follows a comma.
          while (true) {
            if (++items > kMaxItems) return Fail("has too many challenges or parameters");
            auto st = Param(c);
            if (!st) return st.error();
            SkipOws();
            if (AtEnd()) break;
            if (Peek() != ',') return Fail("expected ',' after a parameter");
            size_t save = pos_;
            SkipListSeparators();
            if (AtEnd() || !LooksLikeParam()) {
              pos_ = save;
              break;
            }
          }
        }
      }
      SkipOws();
      if (!AtEnd() && Peek() != ',') return Fail("unexpected character after a challenge");
      out.push_back(std::move(c));
    }
    if (out.empty()) return Fail("has no challenge");
    return out;
  }

 private:
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return s_[pos_]; }

  Error Fail(std::string_view why) const {
    return MakeError(ErrorCode::kProtocol, "WWW-Authenticate header " + std::string(why) +
                                               " (at offset " + std::to_string(pos_) + ")");
  }

  bool SkipSpaces() {
    size_t start = pos_;
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t')) ++pos_;
    return pos_ > start;
  }
  void SkipOws() { SkipSpaces(); }
  void SkipListSeparators() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == ',')) ++pos_;
  }

  std::string_view Token() {
    size_t start = pos_;
    while (!AtEnd() && IsTchar(Peek())) ++pos_;
    return s_.substr(start, pos_ - start);
  }

  // At "token BWS =" where the '=' starts a value (not the padding that ends a token68).
  bool LooksLikeParam() const {
    size_t p = pos_;
    size_t start = p;
    while (p < s_.size() && IsTchar(s_[p])) ++p;
    if (p == start) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    if (p >= s_.size() || s_[p] != '=') return false;
    ++p;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return p < s_.size() && s_[p] != ',' && s_[p] != '=';
  }

  // At a token68 that runs to the end of the challenge: 1*t68char *"=" OWS ( "," / end ).
  bool LooksLikeToken68() const {
    size_t p = pos_;
    size_t start = p;
    while (p < s_.size() && IsToken68Char(s_[p])) ++p;
    if (p == start) return false;
    while (p < s_.size() && s_[p] == '=') ++p;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return p >= s_.size() || s_[p] == ',';
  }

  std::string_view Token68() {
    size_t start = pos_;
    while (!AtEnd() && IsToken68Char(Peek())) ++pos_;
    while (!AtEnd() && Peek() == '=') ++pos_;
    return s_.substr(start, pos_ - start);
  }

  Status Param(Challenge& c) {
    std::string_view name = Token();
    if (name.empty()) return Fail("expected a parameter name");
    SkipOws();
    if (AtEnd() || Peek() != '=') return Fail("expected '=' after a parameter name");
    ++pos_;
    SkipOws();
    std::string value;
    if (!AtEnd() && Peek() == '"') {
      ++pos_;
      bool closed = false;
      while (!AtEnd()) {
        char ch = Peek();
        ++pos_;
        if (ch == '"') {
          closed = true;
          break;
        }
        if (ch == '\\') {
          if (AtEnd()) break;
          ch = Peek();
          ++pos_;
        }
        unsigned char u = static_cast<unsigned char>(ch);
        if ((u < 0x20 && ch != '\t') || u == 0x7f) return Fail("has a control character");
        value += ch;
      }
      if (!closed) return Fail("has an unterminated quoted string");
    } else {
      std::string_view v = Token();
      if (v.empty()) return Fail("expected a parameter value");
      value = std::string(v);
    }
    c.params.emplace(Lower(name), std::move(value));  // the first occurrence wins
    return Ok();
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::vector<Challenge>> ParseWwwAuthenticate(std::string_view header) {
  if (header.size() > kMaxHeader) {
    return MakeError(ErrorCode::kProtocol, "WWW-Authenticate header is longer than " +
                                               std::to_string(kMaxHeader) + " bytes");
  }
  return Parser(header).Parse();
}

}  // namespace shoal::upstream
