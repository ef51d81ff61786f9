// Ids back to text from tokenizer.json, as the `tokenizers` library decodes them (skip_special_tokens): GPT-2's
// byte-level tokens (SmolLM2), Gemma's Sequence of Replace, ByteFallback and Fuse, no decoder (tokens joined by
// spaces); special added tokens skipped; an unknown decoder refused when the file is read.
#include <stdexcept>
#include <string>

#include "check.h"
#include "far/tokenizer.h"

namespace {

std::string with_decoder(const std::string& vocab, const std::string& decoder) {
  return R"({"added_tokens": [{"id": 0, "content": "<s>", "special": true}], "model": {"type": "BPE", "vocab": )" +
         vocab + R"(}, "decoder": )" + decoder + "}";
}

void byte_level() {
  // "Ġ" is the space byte (256 + 32), "Ċ" the newline (256 + 10); "Ã©" the two bytes of "é".
  const far::Tokenizer t(with_decoder(R"({"<s>": 0, "Hello": 1, "Ġworld": 2, "Ċ": 3, "cafÃ©": 4, "Ã": 5})",
                                      R"({"type": "ByteLevel", "add_prefix_space": true})"),
                         "smollm.json");
  CHECK(t.decode({0, 1, 2, 3, 4}) == "Hello world\ncafé");
  CHECK(t.decode({5}) == "\xEF\xBF\xBD");  // half a character: U+FFFD, as the library's lossy conversion
  CHECK(t.decode({1, 99, -1}) == "Hello");  // ids no token has are skipped
}

void gemma_sequence() {
  const std::string decoder = R"({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"},
      "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]})";
  const far::Tokenizer t(with_decoder(R"({"<s>": 0, "▁the": 1, "▁cat": 2, "<0xE2>": 3, "<0x82>": 4, "<0xAC>": 5, "<0xZZ>": 6})",
                                      decoder),
                         "gemma.json");
  CHECK(t.decode({0, 1, 2}) == " the cat");
  CHECK(t.decode({1, 3, 4, 5}) == " the€");
  CHECK(t.decode({3, 4}) == "\xEF\xBF\xBD\xEF\xBF\xBD");  // an invalid run: U+FFFD a byte
  CHECK(t.decode({6}) == "<0xZZ>");  // not a byte: kept as text
}

void no_decoder_and_refusals() {
  const far::Tokenizer t(with_decoder(R"({"<s>": 0, "t": 1, "h": 2, "</s>": 3})", "null"), "chars.json");
  CHECK(t.decode({1, 2, 3}) == "t h </s>");  // no decoder: joined by spaces; </s> is no added special token here
  CHECK_THROWS(std::runtime_error, far::Tokenizer(with_decoder("{}", R"({"type": "WordPiece"})"), "bert.json"),
               "bert.json: its decoder");
  CHECK_THROWS(std::runtime_error, far::Tokenizer(R"({"model": {}})", "empty.json"), "no model vocabulary");
  CHECK_THROWS(std::runtime_error, far::read_tokenizer("/nonexistent/tokenizer.json"), "cannot open");
}

}  // namespace

int main() {
  byte_level();
  gemma_sequence();
  no_decoder_and_refusals();
  return far::test::finish("tokenizer");
}
