// The training examples (a safetensors file) and the seeded order they are visited in.
//
// File (far.device.write_examples writes it): input_ids, attention_mask (int64 [N, L]), token_type_ids (int64
// [N, L], optional: zeros), labels (int64 [N] class ids, float32 [N] for regression); metadata may name the
// export's base_fingerprint. L may differ from the program's max_length: columns past it must be padding
// (attention_mask 0), and shorter rows are padded with the tokenizer's pad id (mask 0, token type 0).
//
// Order (far/device/order.py, the same in every runtime): with splitmix64(x) = SplitMix64's output function,
//   base   = splitmix64(seed ^ splitmix64(epoch))
//   key[i] = splitmix64(base + i)              for i in 0..N-1
//   order  = the indices sorted by key (ties by index)
// and batch j of the epoch is order[j*B, (j+1)*B). The N mod B examples left over are not used in that epoch
// (the programs take exactly B examples; padding with repeats would reweight the loss), and other ones are
// left over the next. The order is a function of (seed, epoch) alone, so a run resumed at any batch sees the
// batches an uninterrupted run would.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "far/safetensors.h"

namespace far {

// An integer column of the file: int64 read in place from the mapping, int32 converted once.
class IntColumn {
 public:
  IntColumn() = default;
  explicit IntColumn(const safetensors::Tensor& t);
  int64_t operator[](int64_t i) const {
    if (!t_) return 0;  // an absent column (token_type_ids) reads as zeros
    return wide_.empty() ? t_->at<int64_t>(i) : wide_[static_cast<size_t>(i)];
  }

 private:
  const safetensors::Tensor* t_ = nullptr;
  std::vector<int64_t> wide_;
};

struct Examples {
  safetensors::File file;                       // the mapping the columns read from
  int64_t n = 0, length = 0;                    // rows, and columns as stored
  IntColumn input_ids, attention_mask, token_type_ids;  // [n, length]
  IntColumn int_labels;                         // [n], classification
  const safetensors::Tensor* float_labels = nullptr;  // [n] float32, regression
  std::string base_fingerprint;                 // of the export it was written for ("" if not recorded)
  std::string num_labels, labels;               // its task's class count and names (JSON); "" if not recorded

  bool float_label() const { return float_labels != nullptr; }
  float float_label(int64_t i) const { return float_labels->at<float>(i); }
};

// Read `path`; std::runtime_error for a malformed file or an example longer than `max_length` tokens.
// Not movable (the columns point into the file), hence the pointer.
std::unique_ptr<Examples> read_examples(const std::string& path, int64_t max_length);
// The same over bytes already in memory (`path` names them in errors).
std::unique_ptr<Examples> read_examples(std::shared_ptr<safetensors::Mapping> bytes, const std::string& path,
                                        int64_t max_length);

// SplitMix64's output function (arithmetic mod 2**64).
uint64_t splitmix64(uint64_t x);

// The visiting order of epoch `epoch`: a permutation of 0..n-1 (see the file comment).
std::vector<int64_t> epoch_order(uint64_t seed, int64_t epoch, int64_t n);

// One batch laid out as the programs want it: [batch, length] token tensors and [batch] labels.
struct Batch {
  int64_t batch = 0, length = 0;
  std::vector<int64_t> input_ids, attention_mask, token_type_ids, int_labels;
  std::vector<float> float_labels;

  Batch(int64_t b, int64_t l);
  // Fill row r of the batch with example `i` of `ex`, cut or padded to `length`.
  void set_row(int64_t r, const Examples& ex, int64_t i, int64_t pad_token_id);
};

}  // namespace far
