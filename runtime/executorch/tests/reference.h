// tests/data/reference.json, written by tests/test_device_reference.py from far's Python code.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "far/json.h"

namespace far::test {

inline Json load_reference(const std::string& data_dir) {
  std::ifstream f(data_dir + "/reference.json");
  if (!f) throw std::runtime_error(data_dir + "/reference.json: cannot open (pass the tests/data folder)");
  std::stringstream text;
  text << f.rdbuf();
  return parse_json(text.str());
}

inline std::vector<float> floats(const Json& values) {
  std::vector<float> out;
  for (const auto& v : values) out.push_back(static_cast<float>(v.get<double>()));
  return out;
}

}  // namespace far::test
