#include "far/tokenizer.h"

#include <cctype>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace far {

namespace {

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the others for 256 + n in order.
const std::map<uint32_t, uint8_t>& byte_of_char() {
  static const std::map<uint32_t, uint8_t> table = [] {
    std::map<uint32_t, uint8_t> t;
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[printable ? b : 256 + extra++] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return table;
}

// The code points of UTF-8 `s`; false if it is not valid UTF-8.
bool code_points(const std::string& s, std::vector<uint32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<uint8_t>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out->push_back(cp);
    i += n;
  }
  return true;
}

// `bytes` as UTF-8, each byte of an invalid sequence replaced by U+FFFD.
std::string lossy_utf8(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<uint8_t>(bytes[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    std::vector<uint32_t> cps;
    if (n > 0 && i + n <= bytes.size() && code_points(bytes.substr(i, n), &cps)) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::string byte_level(const std::string& token) {
  std::vector<uint32_t> cps;
  if (!code_points(token, &cps)) return token;
  std::string bytes;
  for (uint32_t cp : cps) {
    auto it = byte_of_char().find(cp);
    if (it == byte_of_char().end()) return token;  // not a byte-level token: kept as it is
    bytes += static_cast<char>(it->second);
  }
  return bytes;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// "<0xAB>" -> 0xAB; -1 for any other token.
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>' || !std::isxdigit(static_cast<unsigned char>(t[3])) ||
      !std::isxdigit(static_cast<unsigned char>(t[4])))
    return -1;
  return static_cast<int>(std::stoul(t.substr(3, 2), nullptr, 16));
}

}  // namespace

Tokenizer::Tokenizer(const std::string& text, const std::string& path) : path_(path) {
  const Json root = parse_json(text);
  auto fail = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object() || !model->contains("vocab") || !(*model)["vocab"].is_object())
    throw fail("no model vocabulary (\"model\".\"vocab\"); is it a tokenizer.json?");
  auto put = [&](uint64_t id, const std::string& token, bool special) {
    if (id >= (1u << 24)) throw fail("token id " + std::to_string(id) + " is out of range");
    if (id >= tokens_.size()) {
      tokens_.resize(id + 1);
      special_.resize(id + 1, false);
    }
    tokens_[id] = token;
    special_[id] = special;
  };
  for (const auto& [token, id] : (*model)["vocab"].items()) {
    uint64_t n = 0;
    if (!whole_number(id, &n)) throw fail("the vocabulary's id of '" + token + "' is not a whole number");
    put(n, token, false);
  }
  if (auto added = root.find("added_tokens"); added != root.end() && added->is_array())
    for (const Json& t : *added) {
      uint64_t n = 0;
      if (!t.is_object() || !t.contains("id") || !whole_number(t["id"], &n) || !t.contains("content") ||
          !t["content"].is_string())
        throw fail("an added token without id and content");
      put(n, t["content"].get<std::string>(), t.value("special", false));
    }
  if (auto decoder = root.find("decoder"); decoder != root.end()) decoder_ = *decoder;
  apply(decoder_, {});  // refuses a decoder it does not know, before anything runs
}

std::vector<std::string> Tokenizer::apply(const Json& decoder, std::vector<std::string> tokens) const {
  if (decoder.is_null()) {  // the library joins the tokens with spaces
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return {joined};
  }
  const std::string type = decoder.is_object() && decoder.contains("type") && decoder["type"].is_string()
                               ? decoder["type"].get<std::string>()
                               : "";
  if (type == "Sequence" && decoder.contains("decoders") && decoder["decoders"].is_array()) {
    for (const Json& d : decoder["decoders"]) {
      if (d.is_null()) throw std::runtime_error(path_ + ": a null decoder inside a Sequence");
      tokens = apply(d, std::move(tokens));
    }
    return tokens;
  }
  if (type == "ByteLevel") {
    std::string bytes;
    for (const auto& t : tokens) bytes += byte_level(t);
    return {lossy_utf8(bytes)};
  }
  if (type == "Replace" && decoder.contains("pattern") && decoder["pattern"].contains("String") &&
      decoder["pattern"]["String"].is_string() && decoder.contains("content") && decoder["content"].is_string()) {
    for (auto& t : tokens) replace_all(t, decoder["pattern"]["String"].get<std::string>(), decoder["content"].get<std::string>());
    return tokens;
  }
  if (type == "ByteFallback") {  // runs of <0xAB> tokens become their bytes' text (U+FFFD per byte if invalid)
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (run.empty()) return;
      std::vector<uint32_t> cps;
      if (code_points(run, &cps)) out.push_back(run);
      else
        for (size_t i = 0; i < run_tokens; ++i) out.push_back("\xEF\xBF\xBD");
      run.clear();
      run_tokens = 0;
    };
    for (const auto& t : tokens) {
      const int b = byte_token(t);
      if (b >= 0) {
        run += static_cast<char>(b);
        ++run_tokens;
      } else {
        flush();
        out.push_back(t);
      }
    }
    flush();
    return out;
  }
  if (type == "Fuse") {
    std::string joined;
    for (const auto& t : tokens) joined += t;
    return {joined};
  }
  if (type == "Strip" && decoder.contains("content") && decoder["content"].is_string()) {
    const std::string c = decoder["content"].get<std::string>();
    const int64_t start = decoder.value("start", 0), stop = decoder.value("stop", 0);
    for (auto& t : tokens) {
      for (int64_t i = 0; i < start && !c.empty() && t.compare(0, c.size(), c) == 0; ++i) t.erase(0, c.size());
      for (int64_t i = 0; i < stop && !c.empty() && t.size() >= c.size() && t.compare(t.size() - c.size(), c.size(), c) == 0; ++i)
        t.erase(t.size() - c.size());
    }
    return tokens;
  }
  throw std::runtime_error(path_ + ": its decoder " + decoder.dump().substr(0, 120) +
                           " is not one far_generate decodes (ByteLevel; Sequence of Replace, ByteFallback, Fuse, Strip)");
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids)
    if (id >= 0 && id < size() && !special_[id]) tokens.push_back(tokens_[id]);
  std::string text;
  for (const auto& part : apply(decoder_, std::move(tokens))) text += part;
  return text;
}

Tokenizer read_tokenizer(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open (the export folder's tokenizer.json)");
  std::stringstream buf;
  buf << f.rdbuf();
  return Tokenizer(buf.str(), path);
}

}  // namespace far
