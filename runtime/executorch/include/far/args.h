// far_train's command line, and the refusal that ends a run before training (exit status 2).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace far {

// A problem with the inputs, found before training: exit status 2, nothing written.
struct Refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

extern const char* const kUsage;

struct Args {
  std::string out_dir, examples, state, state_out, bottom_cache;
  int64_t epochs = -1, max_steps = 0, checkpoint_every = 0, threads = 0;
  bool resume = false, seed_given = false, help = false;
  uint64_t seed = 0;
};

// `text` as an integer >= `lo`; throws Refusal naming `flag` otherwise (the runner's and far_generate's flags).
int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo);

// Parse argv; throws Refusal naming the bad flag. `help` is set for -h/--help (the other fields may be empty).
Args parse_args(int argc, const char* const* argv);

}  // namespace far
