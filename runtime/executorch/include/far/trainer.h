// far_train's run: everything checked before the first step (the constructor), then the steps (train()).
//
// OUT is what `far export --executorch OUT` writes: train.pte (the joint forward+backward graph: "forward"
// returns the loss, then the gradients, then the trainable tensors), an optional bottom.pte (the frozen bottom,
// forward only: tokens -> hidden states), and manifest.json. STATE is a far.device state file (state.h): the
// trainable tensors, the optimizer's state, and where training stands. The trainer checks it all before the
// first step, copies the state into the program's parameters, and trains until N epochs (or M steps) are
// done: each step averages the gradients of the manifest's `accumulate` micro-batches (the programs' batch)
// and updates with its optimizer (optimizer.h: SGD with momentum or AdamW, clipping, schedule). It
// checkpoints atomically every S steps to STATE_OUT (default: STATE itself) and writes the final state there.
// A run killed at any moment resumes from its last checkpoint to the same final state, bit for bit.
//
// A causal LM's export (manifest objective "next_token") trains on chunks of text instead of examples
// (chunks.h): the frozen bottom runs once per chunk, before the first step, into a cache on disk (reused by a
// resumed run), and each step feeds train.pte the cached hidden states and the chunks' ids. The held-out
// chunks' loss and perplexity (exp of the mean next-token loss) are printed before the first step and after
// the last.
#pragma once

#include <executorch/extension/tensor/tensor_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "far/args.h"
#include "far/chunks.h"
#include "far/examples.h"
#include "far/manifest.h"
#include "far/pages.h"
#include "far/program.h"
#include "far/state.h"

namespace far {

// Which tensor each input of train.pte's "forward" takes.
enum class Role { Hidden, InputIds, AttentionMask, TokenTypeIds, Labels };

// The role of a train.pte input named `name` in the manifest; Refusal for a name the runner does not know.
Role role_of(const std::string& name);
// Without names in the manifest: (hidden, mask, labels) behind a bottom; else (ids, mask, [token types], labels).
std::vector<Role> infer_roles(size_t n_inputs, bool has_bottom);

// One trainable tensor: where the program keeps it and its gradient, its optimizer slots, and (with
// micro-batches) the sum of its gradients over a step.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  float* data = nullptr;  // the program's live parameter (an output aliasing planned memory)
  size_t grad_output = 0, param_output = 0;
  std::vector<std::vector<float>> slots;  // optim::slots() order
  std::vector<float> grad_sum;
  float* grad = nullptr;  // this step's (mean) gradient
};

class Trainer {
 public:
  // Read and check everything; throws Refusal (or another std::exception for a bad file) before any write.
  explicit Trainer(const Args& args);
  // Train to the planned step, checkpointing; std::runtime_error when a step fails (STATE_OUT keeps its last
  // checkpoint).
  void train();

 private:
  void check_programs() const;
  void check_examples() const;
  void plan_steps();
  void check_resume() const;
  void open_programs();
  void bind_inputs();
  void bind_params();
  void load_slots();
  void open_bottom();
  void make_batch_tensors();
  void print_plan() const;
  int64_t n_examples() const { return chunks_ ? chunks_->n_train : examples_->n; }

  // Text (src/text.cpp): the bottom's output of every chunk, cached; a micro-batch's rows; the held-out score.
  void cache_bottom();
  void set_text_rows(const int64_t* rows);
  void report_held_out(const char* when);

  // One step: the micro-batches' forward and backward, their mean gradient, clipping and the update.
  float step_once(const std::vector<int64_t>& order);
  void run_programs();
  void gather_gradients(int64_t part);
  void apply_update();
  void checkpoint() const;

  Args args_;
  Manifest manifest_;
  State state_;
  std::unique_ptr<Examples> examples_;  // or, for a causal LM, chunks_
  std::unique_ptr<Chunks> chunks_;
  std::unique_ptr<BottomCache> bottom_cache_;
  std::vector<float> hidden_;  // a micro-batch's cached hidden states [B, L, hidden]
  std::string examples_sha_;
  int64_t batch_ = 0, accumulate_ = 1, length_ = 0;  // the programs' batch B, micro-batches K, tokens L
  int64_t per_epoch_ = 0, total_ = 0, step_ = 0;
  uint64_t seed_ = 0;
  std::vector<std::string> slot_names_;
  bool slots_started_ = false;

  std::unique_ptr<Program> train_, bottom_;
  executorch::runtime::Method* fwd_ = nullptr;
  std::vector<Role> roles_;
  int64_t bottom_inputs_ = 0;
  std::vector<Param> params_;
  std::unique_ptr<Batch> rows_;
  executorch::extension::TensorPtr ids_, mask_, token_types_, labels_, hidden_in_;
  std::unique_ptr<FilePages> file_pages_;
};

}  // namespace far
