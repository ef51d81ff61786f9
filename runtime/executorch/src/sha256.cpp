#include "far/sha256.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define FAR_SHA_X86 1
#endif

namespace far {

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// FIPS 180-4's compression of `blocks` 64-byte blocks into `state`, one round at a time.
void compress_portable(uint32_t* state, const uint8_t* b, size_t blocks) {
  for (; blocks; --blocks, b += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(b[4 * i]) << 24 | uint32_t(b[4 * i + 1]) << 16 | uint32_t(b[4 * i + 2]) << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], bb = state[1], c = state[2], d = state[3], e = state[4], f = state[5], g = state[6],
             h = state[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
      h = g; g = f; f = e; e = d + t1; d = c; c = bb; bb = a; a = t1 + t2;
    }
    state[0] += a; state[1] += bb; state[2] += c; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
  }
}

#ifdef FAR_SHA_X86
// The same compression with the x86 SHA extensions (sha256rnds2 does two rounds, sha256msg1/msg2 the message
// schedule), several times faster: a program of a few hundred MB is hashed at every start. The instructions keep
// the state as (a, b, e, f) and (c, d, g, h), four rounds' schedule words to a register.
__attribute__((target("sha,sse4.1"))) void compress_sha_x86(uint32_t* h, const uint8_t* b, size_t blocks) {
  const __m128i big_endian = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  const __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)), 0xB1);  // c d a b
  const __m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)), 0x1B);  // e f g h
  __m128i abef = _mm_alignr_epi8(dcba, hgfe, 8), cdgh = _mm_blend_epi16(hgfe, dcba, 0xF0);
  for (; blocks; --blocks, b += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];
    for (int i = 0; i < 16; ++i) {
      __m128i& now = w[i % 4];
      if (i < 4) {
        now = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i)), big_endian);
      } else {  // W[t..t+3] from the four before it: W[t-16] + s0(W[t-15]) + W[t-7] + s1(W[t-2])
        const __m128i minus7 = _mm_alignr_epi8(w[(i + 3) % 4], w[(i + 2) % 4], 4);
        now = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(now, w[(i + 1) % 4]), minus7), w[(i + 3) % 4]);
      }
      __m128i k = _mm_add_epi32(now, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound + 4 * i)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, k);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(k, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B), dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), _mm_alignr_epi8(dchg, feba, 8));
}

bool cpu_has_sha() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1)) return false;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
}
#endif

bool use_cpu_instructions =
#ifdef FAR_SHA_X86
    cpu_has_sha();
#else
    false;
#endif

void compress(uint32_t* h, const uint8_t* b, size_t blocks) {
#ifdef FAR_SHA_X86
  if (use_cpu_instructions) return compress_sha_x86(h, b, blocks);
#endif
  compress_portable(h, b, blocks);
}

}  // namespace

bool sha256_cpu_instructions(bool on) {
#ifdef FAR_SHA_X86
  use_cpu_instructions = on && cpu_has_sha();
#else
  (void)on;
#endif
  return use_cpu_instructions;
}

void Sha256::update(const void* data, size_t n) {
  auto p = static_cast<const uint8_t*>(data);
  total_ += n;
  if (used_) {  // fill the pending block first
    const size_t take = std::min(n, sizeof block_ - used_);
    std::memcpy(block_ + used_, p, take);
    used_ += take;
    p += take;
    n -= take;
    if (used_ < sizeof block_) return;
    compress(h_, block_, 1);
    used_ = 0;
  }
  compress(h_, p, n / sizeof block_);  // whole blocks straight from the caller's buffer
  p += n / sizeof block_ * sizeof block_;
  used_ = n % sizeof block_;
  std::memcpy(block_, p, used_);
}

std::string Sha256::hexdigest() {
  const uint64_t bits = total_ * 8;
  uint8_t pad = 0x80;
  update(&pad, 1);
  pad = 0;
  while (used_ != 56) update(&pad, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(len, 8);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t v : h_)
    for (int s = 28; s >= 0; s -= 4) out += hex[(v >> s) & 0xF];
  return out;
}

std::string file_sha256(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error(path + ": cannot open to hash");
  Sha256 h;
  std::vector<uint8_t> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) h.update(buf.data(), n);
  if (std::ferror(f.get())) throw std::runtime_error(path + ": read error while hashing");
  return h.hexdigest();
}

}  // namespace far
