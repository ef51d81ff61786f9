// SHA-256 (FIPS 180-4) as lowercase hex: how the runner checks that train.pte is the program the manifest
// names, records which examples file a checkpoint was trained on, and seals a state's content
// (README.md says why this is far's own and not a library's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace far {

class Sha256 {
 public:
  void update(const void* data, size_t n);
  void update(const std::string& s) { update(s.data(), s.size()); }
  // The digest of everything updated so far; the hasher is spent afterwards.
  std::string hexdigest();

 private:
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64] = {};
  size_t used_ = 0;
  uint64_t total_ = 0;
};

// Whether Sha256 uses the CPU's SHA instructions (x86-64 with the SHA extensions), switched on or off (`on`; off
// is FIPS 180-4's rounds in C++, which the tests compare them with). Returns the setting in effect.
bool sha256_cpu_instructions(bool on);

// The file's digest; std::runtime_error when it cannot be read.
std::string file_sha256(const std::string& path);

}  // namespace far
