// far_generate's run: greedy decoding with a causal LM export's generate.pte (far export --model NAME --executorch
// OUT --generate) and a training state, the same tokens far's lean runtime writes (`far generate`).
//
// generate.pte's "forward" takes (token int64 [1, 1], position int64 [1], then the trained tensors in the manifest's
// "trainable" order) and returns the next token's logits, float [1, vocab]; it keeps each layer's keys and values in
// mutable buffers of manifest "generate".cache_length positions. The trained tensors are the state's, read in
// place from the mapped state file (the program takes them as unplanned inputs): after far_train, the user's
// training. The prompt is fed a token a call at positions 0, 1, ...; then each arg-max token (the first of equal
// ones, as torch.argmax) is written and fed back, until max_new_tokens or the end-of-text token (written too).
#pragma once

#include <executorch/extension/tensor/tensor_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "far/manifest.h"
#include "far/program.h"
#include "far/state.h"
#include "far/tokenizer.h"

namespace far {

extern const char* const kGenerateUsage;

struct GenerateArgs {
  std::string out_dir, state;
  std::vector<int64_t> prompt_ids;
  int64_t max_new_tokens = 32, threads = 0;
  bool help = false;
};

// Parse argv; throws Refusal naming the bad flag.
GenerateArgs parse_generate_args(int argc, const char* const* argv);

struct Generation {
  std::vector<int64_t> ids;  // the written tokens
  double prefill_s = 0, decode_s = 0;  // the prompt's calls but the last; the calls that wrote a token
};

class Generator {
 public:
  // Read and check everything (the manifest, generate.pte against it, the state, the prompt against the cache);
  // throws Refusal (or another std::exception for a bad file) before the program runs.
  explicit Generator(const GenerateArgs& args);
  Generation run();
  std::string decode(const std::vector<int64_t>& ids) const { return tokenizer_->decode(ids); }
  size_t planned_bytes() const { return program_->planned_bytes(); }

 private:
  void bind_trained();
  const float* step(int64_t token, int64_t position);

  GenerateArgs args_;
  Manifest manifest_;
  State state_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Program> program_;
  executorch::runtime::Method* fwd_ = nullptr;
  std::vector<executorch::extension::TensorPtr> trained_;
  int64_t token_ = 0, position_ = 0;
  executorch::extension::TensorPtr token_in_, position_in_;
};

}  // namespace far
