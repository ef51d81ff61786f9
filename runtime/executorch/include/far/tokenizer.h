// Token ids back to text from a Hugging Face tokenizer.json (the export's), as the `tokenizers` library decodes them
// with skip_special_tokens (what `far generate` prints): each id's token (the added tokens', then the model's
// vocabulary), the special ones skipped, then the file's decoder:
//   ByteLevel (GPT-2, SmolLM2): each character of a token is one byte (GPT-2's bytes-to-unicode table);
//   Sequence of Replace (a string), ByteFallback (<0xAB> tokens are bytes), Fuse, Strip (Gemma, Llama);
//   none: the tokens joined by spaces.
// Invalid UTF-8 in the result becomes U+FFFD, as the library's lossy conversion does. Encoding text is left to
// Python (the pre-tokenizer's Unicode classes and the BPE merges): far_generate takes the prompt's ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "far/json.h"

namespace far {

class Tokenizer {
 public:
  // The tokenizer `text` (tokenizer.json's contents) holds; std::runtime_error for a file it cannot decode with
  // (a decoder far does not know), naming `path`.
  Tokenizer(const std::string& text, const std::string& path);

  std::string decode(const std::vector<int64_t>& ids) const;
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  std::vector<std::string> apply(const Json& decoder, std::vector<std::string> tokens) const;

  std::vector<std::string> tokens_;  // by id ("" for an id no token has)
  std::vector<bool> special_;
  Json decoder_;  // null: join with spaces
  std::string path_;
};

// Read tokenizer.json at `path` (std::runtime_error if unreadable).
Tokenizer read_tokenizer(const std::string& path);

}  // namespace far
