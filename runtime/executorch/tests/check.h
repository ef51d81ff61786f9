// The C++ tests' few checks: each failure prints where and what, and the test's exit status counts them.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

namespace far::test {

inline int failures = 0, checks = 0;

inline void check(bool ok, const char* what, const char* file, int line) {
  ++checks;
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
}

// `body` throws an E whose message contains `part`.
template <typename E>
void check_throws(const std::function<void()>& body, const std::string& part, const char* file, int line) {
  ++checks;
  try {
    body();
  } catch (const E& e) {
    if (std::string(e.what()).find(part) != std::string::npos) return;
    ++failures;
    std::fprintf(stderr, "%s:%d: FAILED: message \"%s\" lacks \"%s\"\n", file, line, e.what(), part.c_str());
    return;
  } catch (const std::exception& e) {
    ++failures;
    std::fprintf(stderr, "%s:%d: FAILED: another exception type: %s\n", file, line, e.what());
    return;
  }
  ++failures;
  std::fprintf(stderr, "%s:%d: FAILED: no exception (expected one saying \"%s\")\n", file, line, part.c_str());
}

// The test's closing line and exit status.
inline int finish(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace far::test

#define CHECK(cond) ::far::test::check((cond), #cond, __FILE__, __LINE__)
#define CHECK_THROWS(E, body, part) ::far::test::check_throws<E>([&] { body; }, (part), __FILE__, __LINE__)
