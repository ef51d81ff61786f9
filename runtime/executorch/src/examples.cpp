#include "far/examples.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace far {

IntColumn::IntColumn(const safetensors::Tensor& t) : t_(&t) {
  if (t.dtype == "I32") {
    wide_.resize(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < wide_.size(); ++i) wide_[i] = t.at<int32_t>(static_cast<int64_t>(i));
  } else if (t.dtype != "I64") {
    throw std::runtime_error("'" + t.name + "' is " + t.dtype + "; expected int64 (I64) or int32");
  }
}

std::unique_ptr<Examples> read_examples(const std::string& path, int64_t max_length) {
  return read_examples(std::make_shared<safetensors::Mapping>(path), path, max_length);
}

std::unique_ptr<Examples> read_examples(std::shared_ptr<safetensors::Mapping> bytes, const std::string& path,
                                        int64_t max_length) {
  auto ex = std::make_unique<Examples>();
  ex->file = safetensors::parse(std::move(bytes), path);
  const safetensors::File& f = ex->file;
  auto fail = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  const safetensors::Tensor *ids = f.find("input_ids"), *mask = f.find("attention_mask"),
                            *tt = f.find("token_type_ids"), *labels = f.find("labels");
  if (!ids || !mask || !labels) throw fail("needs input_ids, attention_mask and labels (token_type_ids is optional)");
  if (ids->shape.size() != 2) throw fail("input_ids must be [N, L], not " + safetensors::shape_str(ids->shape));
  ex->base_fingerprint = f.meta("base_fingerprint");
  ex->num_labels = f.meta("num_labels");
  ex->labels = f.meta("labels");
  ex->n = ids->shape[0];
  ex->length = ids->shape[1];
  // A row of no tokens is no example; and with none, N would be bounded by nothing in the file (a header
  // claiming [2**62, 0] would be read as 2**62 examples, and ordered in a vector of that many).
  if (ex->length < 1) throw fail("input_ids must be [N, L] with L >= 1, not " + safetensors::shape_str(ids->shape));
  if (mask->shape != ids->shape || (tt && tt->shape != ids->shape))
    throw fail("attention_mask and token_type_ids must have input_ids' shape " + safetensors::shape_str(ids->shape));
  if (labels->shape != std::vector<int64_t>{ex->n})
    throw fail("labels must be [" + std::to_string(ex->n) + "], not " + safetensors::shape_str(labels->shape));
  try {
    ex->input_ids = IntColumn(*ids);
    ex->attention_mask = IntColumn(*mask);
    if (tt) ex->token_type_ids = IntColumn(*tt);
    if (labels->dtype == "F32") ex->float_labels = labels;
    else ex->int_labels = IntColumn(*labels);
  } catch (const std::runtime_error& e) {
    throw fail(e.what());
  }
  // An example's length is one past its last attended token; anything after it is padding we may drop.
  for (int64_t i = 0; i < ex->n; ++i) {
    int64_t len = 0;
    for (int64_t j = 0; j < ex->length; ++j)
      if (ex->attention_mask[i * ex->length + j] != 0) len = j + 1;
    if (len > max_length)
      throw fail("example " + std::to_string(i) + " has " + std::to_string(len) + " tokens, more than the program's " +
                 "max_length " + std::to_string(max_length) + "; write the examples with truncation to " +
                 std::to_string(max_length) + " tokens, or export with a longer max_length");
  }
  return ex;
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<int64_t> epoch_order(uint64_t seed, int64_t epoch, int64_t n) {
  const uint64_t base = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch)));
  std::vector<std::pair<uint64_t, int64_t>> keyed(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keyed[i] = {splitmix64(base + static_cast<uint64_t>(i)), i};
  std::sort(keyed.begin(), keyed.end());  // by key, then by index
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = keyed[i].second;
  return order;
}

Batch::Batch(int64_t b, int64_t l)
    : batch(b), length(l), input_ids(b * l), attention_mask(b * l), token_type_ids(b * l), int_labels(b),
      float_labels(b) {}

void Batch::set_row(int64_t r, const Examples& ex, int64_t i, int64_t pad_token_id) {
  for (int64_t j = 0; j < length; ++j) {
    const bool in = j < ex.length;
    input_ids[r * length + j] = in ? ex.input_ids[i * ex.length + j] : pad_token_id;
    attention_mask[r * length + j] = in ? ex.attention_mask[i * ex.length + j] : 0;
    token_type_ids[r * length + j] = in ? ex.token_type_ids[i * ex.length + j] : 0;
  }
  if (ex.float_label()) float_labels[r] = ex.float_label(i);
  else int_labels[r] = ex.int_labels[i];
}

}  // namespace far
