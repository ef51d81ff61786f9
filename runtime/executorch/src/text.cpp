// far::Trainer on a causal LM's chunks of text (trainer.h): the bottom's output cached once, a micro-batch's
// rows from the chunks and the cache, and the held-out chunks' perplexity.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "far/trainer.h"

namespace far {

using executorch::runtime::EValue;

// The bottom program's output for every chunk (train rows, then held-out rows), `batch_` at a time, kept on
// disk; then the program is let go (its planned memory with it): training never runs it again.
void Trainer::cache_bottom() {
  const int64_t rows = chunks_->n_train + chunks_->n_held_out, per_row = length_ * manifest_.hidden_size;
  const std::map<std::string, std::string> key = {{"bottom_sha256", manifest_.bottom.sha256},
                                                  {"chunks_sha256", examples_sha_}};
  executorch::runtime::Method& bm = bottom_->forward();
  file_pages_->release();  // what loading train.pte and copying the state's tensors read
  auto compute = [&](int64_t first, float* out) {
    for (int64_t r = 0; r < batch_; ++r) {  // rows past the end repeat the last chunk: their output is dropped
      const int64_t row = std::min(first + r, rows - 1);
      for (int64_t j = 0; j < length_; ++j) rows_->input_ids[r * length_ + j] = chunks_->id(row, j);
    }
    const auto e = bm.set_input(EValue(*ids_), 0);
    if (e != executorch::runtime::Error::Ok)
      throw std::runtime_error("cannot set bottom.pte's input (ExecuTorch error " + error_name(e) + ")");
    bottom_->execute();
    const auto hidden = bm.get_output(0).toTensor();
    if (hidden.numel() != batch_ * per_row) throw std::runtime_error("bottom.pte returned an output of another size");
    std::memcpy(out, hidden.const_data_ptr<float>(), static_cast<size_t>(batch_ * per_row) * sizeof(float));
    file_pages_->release();  // bottom.pte's weights, read again from the page cache by the next micro-batch
  };
  bottom_cache_ = std::make_unique<BottomCache>(args_.bottom_cache, key, rows, length_, manifest_.hidden_size, batch_,
                                                compute);
  std::printf("bottom cache: %s %s (%lld chunks, %.1f MB)\n", bottom_cache_->built() ? "wrote" : "reused",
              args_.bottom_cache.c_str(), (long long)rows, rows * per_row * 4 / 1e6);
  std::fflush(stdout);
  bottom_.reset();
}

// Chunks `rows[0..batch_)` (train rows, or held-out ones counted after them) as train.pte's two inputs.
void Trainer::set_text_rows(const int64_t* rows) {
  const int64_t per_row = bottom_cache_->row_floats();
  for (int64_t r = 0; r < batch_; ++r) {
    for (int64_t j = 0; j < length_; ++j) rows_->input_ids[r * length_ + j] = chunks_->id(rows[r], j);
    std::memcpy(&hidden_[r * per_row], bottom_cache_->row(rows[r]), static_cast<size_t>(per_row) * sizeof(float));
  }
}

// The mean next-token loss over the held-out chunks' whole micro-batches, in file order, and its exp: the
// training program's forward scores them (the gradients it also computes are not used).
void Trainer::report_held_out(const char* when) {
  const int64_t n = chunks_->n_held_out - chunks_->n_held_out % batch_;
  if (n == 0) {
    std::printf("held_out %s: no whole micro-batch of %lld held-out chunks to score\n", when, (long long)batch_);
    return;
  }
  double loss = 0;
  std::vector<int64_t> rows(static_cast<size_t>(batch_));
  for (int64_t start = 0; start < n; start += batch_) {
    for (int64_t r = 0; r < batch_; ++r) rows[r] = chunks_->n_train + start + r;
    set_text_rows(rows.data());
    run_programs();
    loss += fwd_->get_output(0).toTensor().const_data_ptr<float>()[0];
  }
  file_pages_->release();
  loss /= static_cast<double>(n / batch_);
  std::printf("held_out %s step=%lld chunks=%lld loss=%.6f perplexity=%.6f\n", when, (long long)step_, (long long)n,
              loss, std::exp(loss));
  std::fflush(stdout);
}

}  // namespace far
