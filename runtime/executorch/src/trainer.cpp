#include "far/trainer.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "far/json.h"
#include "far/optimizer.h"
#include "far/sha256.h"

namespace far {

using executorch::aten::ScalarType;
using executorch::runtime::EValue;
using executorch::runtime::Method;
using safetensors::shape_str;

namespace {

// Instructions of a causal LM's train.pte between two give-backs of the mapped pages they read (SmolLM2's runs
// 5,938 per micro-batch: a give-back every 256 holds about a layer's frozen weights at a time).
constexpr size_t kReleaseEvery = 256;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<int64_t> sizes_of(const executorch::runtime::TensorInfo& info) {
  std::vector<int64_t> out;
  for (int32_t d : info.sizes()) out.push_back(d);
  return out;
}

void set_input(Method& m, size_t i, const EValue& v, const char* what) {
  const auto e = m.set_input(v, i);
  if (e != executorch::runtime::Error::Ok)
    throw std::runtime_error("cannot set input " + std::to_string(i) + " of " + what + " (ExecuTorch error " +
                             error_name(e) + ")");
}

}  // namespace

// ---- everything is checked before the first step ----

Trainer::Trainer(const Args& args) : args_(args), manifest_(read_manifest(args.out_dir)) {
  if (args_.threads > 0) set_threads(static_cast<uint32_t>(args_.threads));
  check_programs();
  const bool resuming_from_out = args_.resume && args_.state_out != args_.state && exists(args_.state_out);
  state_ = read_state(resuming_from_out ? args_.state_out : args_.state, manifest_);
  if (manifest_.next_token) {
    chunks_ = read_chunks(args_.examples, manifest_.max_length, manifest_.vocab_size, manifest_.base_fingerprint);
  } else {
    examples_ = read_examples(args_.examples, manifest_.max_length);
    check_examples();
  }
  examples_sha_ = file_sha256(args_.examples);
  plan_steps();
  check_resume();
  open_programs();
  bind_inputs();
  bind_params();
  open_bottom();
  make_batch_tensors();
  print_plan();
  // What a step reads of the mapped files is given back after it (pages.h), so resident memory holds one step's.
  std::vector<std::string> mapped = {manifest_.path(manifest_.train), args_.examples, state_.path};
  if (bottom_) mapped.push_back(manifest_.path(manifest_.bottom));
  file_pages_ = std::make_unique<FilePages>(mapped);
  // The bottom runs before the optimizer's slots and the gradient sums exist, and with the pages that loading
  // train.pte and the state read given back: its memory and the training's are not held at once.
  if (chunks_) {
    cache_bottom();  // and the bottom program is let go
    mapped.push_back(bottom_cache_->path());
    file_pages_ = std::make_unique<FilePages>(mapped);
  }
  load_slots();
}

// Steps per epoch and the step to stop at; the order's seed.
void Trainer::plan_steps() {
  batch_ = manifest_.batch_size;
  accumulate_ = manifest_.accumulate;
  const int64_t per_step = batch_ * accumulate_;
  if (n_examples() < per_step)
    throw Refusal(args_.examples + " has " + std::to_string(n_examples()) + (chunks_ ? " training chunks" : " examples") +
                  ", fewer than a step's " + std::to_string(per_step) +
                  " (short batches are dropped, so nothing would train)");
  per_epoch_ = n_examples() / per_step;
  total_ = args_.epochs * per_epoch_;
  if (args_.max_steps > 0) total_ = std::min(total_, args_.max_steps);
  step_ = state_.step;
  seed_ = args_.seed_given ? args_.seed : state_.order_seed;
  slot_names_ = optim::slots(manifest_.optimizer);
}

// The programs, mapped read-only: a training program whose trained tensors are the manifest's.
void Trainer::open_programs() {
  train_ = std::make_unique<Program>(manifest_.path(manifest_.train));
  if (manifest_.has_bottom()) bottom_ = std::make_unique<Program>(manifest_.path(manifest_.bottom));
  for (const char* meta : {"__et_training_gradients_index_forward", "__et_training_parameters_index_forward"})
    if (!train_->has_method(meta))
      throw Refusal(train_->path() + " has no method " + meta + ": not a training program (export it with far)");
  const int64_t grad_start = train_->meta_int("__et_training_gradients_index_forward");
  const int64_t param_start = train_->meta_int("__et_training_parameters_index_forward");
  const int64_t n_params = param_start - grad_start;
  if (n_params != static_cast<int64_t>(manifest_.trainable.size()))
    throw Refusal(train_->path() + " trains " + std::to_string(n_params) + " tensors, manifest.json lists " +
                  std::to_string(manifest_.trainable.size()));
  if (train_->has_method("__et_training_fqn_forward")) {
    train_->run_meta("__et_training_fqn_forward", [&](Method& m) {
      for (size_t i = 0; i < m.outputs_size() && i < manifest_.trainable.size(); ++i)
        if (std::string(m.get_output(i).toString()) != manifest_.trainable[i].name)
          throw Refusal(train_->path() + " trains '" + std::string(m.get_output(i).toString()) + "' as tensor " +
                        std::to_string(i) + ", manifest.json says '" + manifest_.trainable[i].name + "'");
    });
  }
  params_.resize(static_cast<size_t>(n_params));
  for (int64_t i = 0; i < n_params; ++i) {  // outputs [param_start, +n) alias the weights; gradients at grad_start
    params_[i].name = manifest_.trainable[i].name;
    params_[i].grad_output = static_cast<size_t>(grad_start + i);
    params_[i].param_output = static_cast<size_t>(param_start + i);
  }
  fwd_ = &train_->load_forward();
}

// What each input of train.pte takes, checked against the batch and the examples' labels.
void Trainer::bind_inputs() {
  const auto meta = train_->forward_meta();
  if (!manifest_.inputs.empty()) {
    for (const auto& n : manifest_.inputs) roles_.push_back(role_of(n));
    if (roles_.size() != meta.num_inputs())
      throw Refusal("manifest.json names " + std::to_string(roles_.size()) + " inputs, train.pte takes " +
                    std::to_string(meta.num_inputs()));
  } else {
    roles_ = infer_roles(meta.num_inputs(), bottom_ != nullptr);
  }
  if (chunks_ && roles_ != std::vector<Role>{Role::Hidden, Role::InputIds})
    throw Refusal("a next_token export's train.pte must take (hidden, input_ids); export the folder again");
  const bool float_label = examples_ && examples_->float_label();
  for (size_t i = 0; i < roles_.size(); ++i) {
    const auto info = meta.input_tensor_meta(i).get();
    const auto sz = sizes_of(info);
    if (sz.empty() || sz[0] != batch_)
      throw Refusal("train.pte's input " + std::to_string(i) + " has shape " + shape_str(sz) + ", not batch_size " +
                    std::to_string(batch_) + " first");
    if (roles_[i] == Role::Labels) {
      if ((info.scalar_type() == ScalarType::Float) != float_label)
        throw Refusal("train.pte takes " + std::string(float_label ? "int64" : "float32") + " labels, " +
                      args_.examples + " holds " + (float_label ? "float32" : "int64") + " ones");
    } else if (sz.size() >= 2) {
      length_ = sz[1];
    }
  }
  if (length_ != manifest_.max_length)
    throw Refusal("train.pte takes sequences of " + std::to_string(length_) + " tokens, manifest.json says max_length " +
                  std::to_string(manifest_.max_length));
}

// The live parameters, in planned memory, take the state's values (before any execution: see program.h).
void Trainer::bind_params() {
  for (Param& p : params_) {
    auto t = fwd_->get_output(p.param_output).toTensor();
    if (t.scalar_type() != ScalarType::Float) throw Refusal(train_->path() + ": '" + p.name + "' is not float32");
    for (auto d : t.sizes()) p.shape.push_back(d);
    p.numel = t.numel();
    p.data = t.mutable_data_ptr<float>();
    if (!train_->in_planned(p.data, p.numel * sizeof(float)))
      throw Refusal(train_->path() + ": parameter '" + p.name + "' is not in planned (writable) memory; "
                    "far_train needs the parameters exported as mutable, memory-planned tensors");
    if (state_.tensor(p.name).shape != p.shape)
      throw Refusal(state_.path + ": '" + p.name + "' has shape " + shape_str(state_.tensor(p.name).shape) +
                    ", the program's is " + shape_str(p.shape));
  }
  for (Param& p : params_) std::memcpy(p.data, state_.tensor(p.name).data, p.numel * sizeof(float));
}

// The optimizer's slots (the state's, or zeros) and, with micro-batches, the gradient sums; the state is unmapped.
void Trainer::load_slots() {
  for (Param& p : params_) {
    for (const std::string& slot : slot_names_) {
      p.slots.emplace_back(static_cast<size_t>(p.numel), 0.f);
      if (const safetensors::Tensor* held = state_.slot(slot, p.name))
        std::memcpy(p.slots.back().data(), held->data, p.numel * sizeof(float));
    }
    if (accumulate_ > 1) p.grad_sum.assign(static_cast<size_t>(p.numel), 0.f);
  }
  slots_started_ = !slot_names_.empty() && state_.slot(slot_names_[0], params_.front().name) != nullptr;
  state_.file = safetensors::File();  // unmap it: the program holds its values
}

void Trainer::open_bottom() {
  if (!bottom_) return;
  bottom_->load_forward();
  bottom_inputs_ = static_cast<int64_t>(bottom_->forward_meta().num_inputs());
  const auto hidden = sizes_of(bottom_->forward_meta().output_tensor_meta(0).get());
  const auto meta = train_->forward_meta();
  for (size_t i = 0; i < roles_.size(); ++i)
    if (roles_[i] == Role::Hidden && hidden != sizes_of(meta.input_tensor_meta(i).get()))
      throw Refusal("bottom.pte returns " + shape_str(hidden) + ", train.pte takes hidden states of " +
                    shape_str(sizes_of(meta.input_tensor_meta(i).get())));
}

// The batch's buffers, and the tensors over them that feed the programs.
void Trainer::make_batch_tensors() {
  using executorch::extension::make_tensor_ptr;
  rows_ = std::make_unique<Batch>(batch_, length_);
  const auto b = static_cast<int32_t>(batch_), l = static_cast<int32_t>(length_);
  ids_ = make_tensor_ptr({b, l}, rows_->input_ids.data(), ScalarType::Long);
  mask_ = make_tensor_ptr({b, l}, rows_->attention_mask.data(), ScalarType::Long);
  token_types_ = make_tensor_ptr({b, l}, rows_->token_type_ids.data(), ScalarType::Long);
  if (chunks_) {
    const auto h = static_cast<int32_t>(manifest_.hidden_size);
    hidden_.assign(static_cast<size_t>(batch_ * length_ * manifest_.hidden_size), 0.f);
    hidden_in_ = make_tensor_ptr({b, l, h}, hidden_.data(), ScalarType::Float);
    return;
  }
  labels_ = examples_->float_label() ? make_tensor_ptr({b}, rows_->float_labels.data(), ScalarType::Float)
                                     : make_tensor_ptr({b}, rows_->int_labels.data(), ScalarType::Long);
}

void Trainer::print_plan() const {
  int64_t n_values = 0;
  for (const Param& p : params_) n_values += p.numel;
  char bottom[64] = "";
  if (bottom_) std::snprintf(bottom, sizeof bottom, ", bottom.pte (planned %.1f MB)", bottom_->planned_bytes() / 1e6);
  const int64_t n = n_examples();
  std::printf("far_train: %s (planned %.1f MB)%s; %zu trainable tensors (%lld values); %s; batch %lld x %lld in %lld "
              "micro-batch(es); %lld %s -> %lld batches/epoch (%lld left over each epoch); from step %lld to step "
              "%lld; order_seed %llu\n",
              train_->path().c_str(), train_->planned_bytes() / 1e6, bottom, params_.size(), (long long)n_values,
              manifest_.optimizer.name.c_str(), (long long)(batch_ * accumulate_), (long long)length_,
              (long long)accumulate_, (long long)n, chunks_ ? "chunks" : "examples", (long long)per_epoch_,
              (long long)(n - per_epoch_ * batch_ * accumulate_), (long long)step_, (long long)total_,
              (unsigned long long)seed_);
  std::fflush(stdout);
}

// ---- training ----

namespace {
// The process's CPU seconds (every thread's): a step's share of a shared machine, which its wall time is not.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

void Trainer::train() {
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  if (chunks_) report_held_out("before");
  while (step_ < total_) {
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = process_cpu_seconds();
    const int64_t epoch = step_ / per_epoch_;
    if (epoch != order_epoch) {
      order = epoch_order(seed_, epoch, n_examples());
      order_epoch = epoch;
    }
    const float loss = step_once(order);
    ++step_;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = process_cpu_seconds() - cpu0;
    std::printf("step=%lld epoch=%lld loss=%.6f time_s=%.3f cpu_s=%.3f\n", (long long)step_, (long long)epoch, loss,
                secs, cpu);
    if (args_.checkpoint_every > 0 && step_ % args_.checkpoint_every == 0 && step_ < total_) {
      checkpoint();
      std::printf("checkpoint step=%lld %s\n", (long long)step_, args_.state_out.c_str());
    }
    std::fflush(stdout);
  }
  checkpoint();
  if (chunks_) report_held_out("after");
  std::printf("done step=%lld %s\n", (long long)step_, args_.state_out.c_str());
}

float Trainer::step_once(const std::vector<int64_t>& order) {
  const int64_t next = step_ % per_epoch_;  // batch `next` of the epoch
  float loss = 0.f;
  for (int64_t part = 0; part < accumulate_; ++part) {  // each gradient is a micro-batch mean: their mean is the step's
    const int64_t* rows = &order[(next * accumulate_ + part) * batch_];
    if (chunks_) set_text_rows(rows);
    else
      for (int64_t r = 0; r < batch_; ++r) rows_->set_row(r, *examples_, rows[r], manifest_.pad_token_id);
    run_programs();
    const float part_loss = fwd_->get_output(0).toTensor().const_data_ptr<float>()[0];
    if (!std::isfinite(part_loss))
      throw std::runtime_error("loss is " + std::to_string(part_loss) + " at step " + std::to_string(step_ + 1) +
                               "; stopping (" + args_.state_out + " keeps the last checkpoint)");
    loss += part_loss / static_cast<float>(accumulate_);
    gather_gradients(part);
  }
  apply_update();
  file_pages_->release();
  return loss;
}

// The bottom (if any) on the batch's tokens, then train.pte's forward and backward.
void Trainer::run_programs() {
  if (bottom_ && !chunks_) {  // frozen bottom: tokens -> hidden states, forward only (text: cached)
    Method& bm = bottom_->forward();
    set_input(bm, 0, EValue(*ids_), "bottom.pte");
    set_input(bm, 1, EValue(*mask_), "bottom.pte");
    if (bottom_inputs_ > 2) set_input(bm, 2, EValue(*token_types_), "bottom.pte");
    bottom_->execute();
    file_pages_->release();  // the embedding rows (and, on the first step, the weights XNNPACK packed)
  }
  for (size_t i = 0; i < roles_.size(); ++i) {
    switch (roles_[i]) {
      case Role::Hidden:
        set_input(*fwd_, i, chunks_ ? EValue(*hidden_in_) : bottom_->forward().get_output(0), "train.pte");
        break;
      case Role::InputIds: set_input(*fwd_, i, EValue(*ids_), "train.pte"); break;
      case Role::AttentionMask: set_input(*fwd_, i, EValue(*mask_), "train.pte"); break;
      case Role::TokenTypeIds: set_input(*fwd_, i, EValue(*token_types_), "train.pte"); break;
      case Role::Labels: set_input(*fwd_, i, EValue(*labels_), "train.pte"); break;
    }
  }
  if (chunks_)  // a causal LM: its frozen bf16 blocks and the embedding are read a layer at a time (program.h)
    train_->execute_in_steps(kReleaseEvery, [this] { file_pages_->release(); });
  else
    train_->execute();
}

// Micro-batch `part`'s gradients: used in place for one micro-batch, else summed (and averaged after the last).
void Trainer::gather_gradients(int64_t part) {
  for (Param& p : params_) {
    if (fwd_->get_output(p.param_output).toTensor().const_data_ptr<float>() != p.data)
      throw std::runtime_error("'" + p.name + "' moved during execution: its output stopped aliasing the weight");
    float* g = fwd_->get_output(p.grad_output).toTensor().mutable_data_ptr<float>();
    if (accumulate_ == 1) {
      p.grad = g;
      continue;
    }
    if (part == 0) std::memcpy(p.grad_sum.data(), g, p.numel * sizeof(float));
    else
      for (int64_t i = 0; i < p.numel; ++i) p.grad_sum[i] += g[i];
    if (part == accumulate_ - 1) {
      for (int64_t i = 0; i < p.numel; ++i) p.grad_sum[i] /= static_cast<float>(accumulate_);
      p.grad = p.grad_sum.data();
    }
  }
}

// Clipping, the schedule's learning rate, and the optimizer's update of every parameter.
void Trainer::apply_update() {
  const OptimizerSettings& o = manifest_.optimizer;
  if (o.max_grad_norm > 0) {
    std::vector<std::pair<const float*, int64_t>> grads;
    for (const Param& p : params_) grads.emplace_back(p.grad, p.numel);
    const float factor = optim::clip_factor(grads, o.max_grad_norm);
    for (Param& p : params_)
      for (int64_t i = 0; i < p.numel; ++i) p.grad[i] *= factor;
  }
  const double lr = optim::lr_at(o, step_, total_);
  for (Param& p : params_) {
    std::vector<float*> slots;
    for (auto& s : p.slots) slots.push_back(s.data());
    optim::update(o, lr, step_ + 1, p.data, p.grad, slots, !slots_started_, p.numel);
  }
  slots_started_ = !slot_names_.empty();
}

void Trainer::checkpoint() const {
  std::vector<safetensors::TensorView> views;
  for (const Param& p : params_) views.push_back({p.name, "F32", p.shape, p.data});
  if (slots_started_)
    for (size_t s = 0; s < slot_names_.size(); ++s)
      for (const Param& p : params_) views.push_back({slot_names_[s] + ":" + p.name, "F32", p.shape, p.slots[s].data()});
  const Progress progress{step_, step_ / per_epoch_, step_ % per_epoch_, seed_, step_ > 0 ? examples_sha_ : ""};
  write_state(args_.state_out, manifest_, views, progress);
}

}  // namespace far
