// JSON for the runner's files (safetensors headers, manifest.json): nlohmann/json (third_party/), keys in file
// order, with the checks a file from anywhere needs on top.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace far {

using Json = nlohmann::ordered_json;

// Parse `text`; std::runtime_error naming the byte for malformed JSON, and for a key repeated within one
// object or nesting deeper than 64 (nlohmann would keep the last of two keys; a reader must not guess).
Json parse_json(const std::string& text);

// `v` as a whole number >= 0 (a count, a size, an offset), or false when it is not one.
bool whole_number(const Json& v, uint64_t* out);

}  // namespace far
