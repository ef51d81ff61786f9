// A user's texts as packed chunks of token ids (far/device/lm_text.py writes them: `far export --model NAME
// --train-file TEXTS` leaves OUT/text.safetensors), and the frozen bottom's output of each chunk, kept on disk.
//
// Chunks file: "train" int32 [N, max_length], "held_out" int32 [M, max_length]; metadata format
// "far.device.chunks", format_version "1", base_fingerprint, max_length, vocab_size. The reader refuses a
// file of another export (base, length, vocabulary) and any id outside the vocabulary, before training.
//
// Bottom cache: the bottom program's output for every chunk, train rows then held-out rows, float32
// [N + M, max_length, hidden] in one safetensors file ("hidden"), written once (atomically, row group by row
// group, never held whole in memory) and mapped read-only after: a step copies its rows from the mapping,
// and the OS keeps only the pages in use. Its metadata names the bottom program's and the chunks file's
// sha256, so a cache of other chunks or another program is rebuilt, never used; a resumed run reuses it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "far/safetensors.h"

namespace far {

struct Chunks {
  safetensors::File file;  // the mapping the ids are read from
  const safetensors::Tensor* train = nullptr;     // [n_train, length] int32
  const safetensors::Tensor* held_out = nullptr;  // [n_held_out, length] int32
  int64_t n_train = 0, n_held_out = 0, length = 0;

  // Token j of chunk `row`, counting train rows then held-out rows.
  int64_t id(int64_t row, int64_t j) const {
    return row < n_train ? train->at<int32_t>(row * length + j) : held_out->at<int32_t>((row - n_train) * length + j);
  }
};

// Read and check `path` for an export of `max_length` tokens, `vocab_size` ids and `base_fingerprint`;
// std::runtime_error naming the file and what to do.
std::unique_ptr<Chunks> read_chunks(const std::string& path, int64_t max_length, int64_t vocab_size,
                                    const std::string& base_fingerprint);
// The same over bytes already in memory (`path` names them in errors).
std::unique_ptr<Chunks> read_chunks(std::shared_ptr<safetensors::Mapping> bytes, const std::string& path,
                                    int64_t max_length, int64_t vocab_size, const std::string& base_fingerprint);

// The bottom's output of `rows` chunks, [rows, length, hidden] float32, on disk at `path`.
class BottomCache {
 public:
  // Fills `out` ([batch, length, hidden]) with the bottom's output for rows first .. first + batch - 1 (rows
  // past the end may be anything: their output is not kept).
  using Compute = std::function<void(int64_t first, float* out)>;

  // Map `path` if it holds the output for `key` (the programs' and chunks' sha256) of this shape; else compute
  // it `batch` rows at a time and write it atomically first. `built` says which happened.
  BottomCache(const std::string& path, const std::map<std::string, std::string>& key, int64_t rows, int64_t length,
              int64_t hidden, int64_t batch, const Compute& compute);

  const float* row(int64_t r) const { return data_ + r * length_ * hidden_; }
  int64_t row_floats() const { return length_ * hidden_; }
  bool built() const { return built_; }
  const std::string& path() const { return path_; }

 private:
  bool matches(const std::map<std::string, std::string>& key, const std::vector<int64_t>& shape);
  void build(const std::map<std::string, std::string>& key, const std::vector<int64_t>& shape, int64_t batch,
             const Compute& compute);

  std::string path_;
  safetensors::File file_;
  const float* data_ = nullptr;
  int64_t length_ = 0, hidden_ = 0;
  bool built_ = false;
};

}  // namespace far
