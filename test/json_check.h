// A minimal JSON syntax check for the tests: is `text` exactly one well-formed JSON value?
// (RFC 8259 grammar; no semantic checks beyond duplicate-free parsing of the syntax.)
#ifndef KVENGINE_TEST_JSON_CHECK_H_
#define KVENGINE_TEST_JSON_CHECK_H_

#include <cctype>
#include <cstring>
#include <string>
#include <string_view>

namespace kvengine::test {

class JsonChecker {
 public:
  // Returns true when `text` is one JSON value, optionally surrounded by whitespace.
  // Otherwise stores where and why it failed in *error (may be nullptr).
  static bool Valid(std::string_view text, std::string* error = nullptr) {
    JsonChecker c(text);
    bool ok = c.Value(0) && (c.Blank(), c.pos_ == text.size());
    if (!ok && error != nullptr) {
      *error = "invalid JSON at offset " + std::to_string(c.pos_) + ": '" +
               std::string(text.substr(c.pos_, 40)) + "'";
    }
    return ok;
  }

 private:
  explicit JsonChecker(std::string_view t) : t_(t) {}
  void Blank() {
    while (pos_ < t_.size() && std::strchr(" \t\r\n", t_[pos_]) != nullptr && t_[pos_] != '\0')
      pos_++;
  }
  bool Eat(char c) {
    Blank();
    if (pos_ < t_.size() && t_[pos_] == c) {
      pos_++;
      return true;
    }
    return false;
  }
  bool Literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool String() {
    if (!Eat('"')) return false;
    while (pos_ < t_.size()) {
      const unsigned char c = static_cast<unsigned char>(t_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (pos_ >= t_.size()) return false;
        const char e = t_[pos_++];
        if (e == 'u') {
          for (int i = 0; i < 4; i++) {
            if (pos_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[pos_++])))
              return false;
          }
        } else if (std::strchr("\"\\/bfnrt", e) == nullptr || e == '\0') {
          return false;
        }
      }
    }
    return false;
  }
  bool Digits() {
    size_t start = pos_;
    while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) pos_++;
    return pos_ > start;
  }
  bool Number() {
    if (pos_ < t_.size() && t_[pos_] == '-') pos_++;
    if (pos_ < t_.size() && t_[pos_] == '0') {
      pos_++;
    } else if (!Digits()) {
      return false;
    }
    if (pos_ < t_.size() && t_[pos_] == '.') {
      pos_++;
      if (!Digits()) return false;
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      pos_++;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) pos_++;
      if (!Digits()) return false;
    }
    return true;
  }
  bool Value(int depth) {
    if (depth > 64) return false;
    Blank();
    if (pos_ >= t_.size()) return false;
    const char c = t_[pos_];
    if (c == '{') {
      pos_++;
      if (Eat('}')) return true;
      do {
        if (!String() || !Eat(':') || !Value(depth + 1)) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      pos_++;
      if (Eat(']')) return true;
      do {
        if (!Value(depth + 1)) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') return String();
    if (c == 't') return Literal("true");
    if (c == 'f') return Literal("false");
    if (c == 'n') return Literal("null");
    return Number();
  }

  std::string_view t_;
  size_t pos_ = 0;
};

}  // namespace kvengine::test

#endif  // KVENGINE_TEST_JSON_CHECK_H_
