#include "far/json.h"

#include <set>
#include <stdexcept>
#include <vector>

namespace far {

Json parse_json(const std::string& text) {
  constexpr int kMaxDepth = 64;
  std::vector<std::set<std::string>> keys;  // one set per object being read
  auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxDepth) throw std::runtime_error("malformed JSON: nested deeper than " + std::to_string(kMaxDepth));
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    else if (event == Json::parse_event_t::object_end) keys.pop_back();
    else if (event == Json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second)
      throw std::runtime_error("malformed JSON: the key \"" + parsed.get<std::string>() + "\" appears twice in one object");
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::exception& e) {
    throw std::runtime_error(std::string("malformed JSON: ") + e.what());
  }
}

bool whole_number(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace far
