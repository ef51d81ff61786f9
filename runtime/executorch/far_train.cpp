// far_train: train an exported FAR program on the device, without Python.
//
//   far_train OUT --examples FILE --state STATE --epochs N [--max-steps M] [--checkpoint-every S]
//             [--out STATE_OUT] [--resume] [--seed K] [--threads T]
//
// OUT is what `far export --executorch OUT` writes: train.pte (the joint forward+backward graph: "forward"
// returns the loss, then the gradients, then the trainable tensors), an optional bottom.pte (the frozen bottom,
// forward only: tokens -> hidden states), and manifest.json. STATE is a far.device state file (state.h): the
// trainable tensors, the optimizer's state, and where training stands. The runner checks it all before the
// first step, copies the state into the program's parameters, and trains until N epochs (or M steps) are
// done: each step averages the gradients of the manifest's `accumulate` micro-batches (the programs' batch)
// and updates with its optimizer (optimizer.h: SGD with momentum or AdamW, clipping, schedule). It
// checkpoints atomically every S steps to STATE_OUT (default: STATE itself) and writes the final state there.
// A run killed at any moment resumes from its last checkpoint to the same final state, bit for bit.
//
// Exit status: 0 done; 2 refused before training (bad arguments, state, examples, manifest or program);
// 1 failed while training (an ExecuTorch error, a non-finite loss). Either way STATE_OUT keeps its last
// complete version.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "args.h"
#include "et_program.h"
#include "examples.h"
#include "manifest.h"
#include "safetensors.h"
#include "optimizer.h"
#include "pages.h"
#include "sha256.h"
#include "state.h"

namespace {

using executorch::aten::ScalarType;
using executorch::runtime::EValue;
using executorch::runtime::Method;
using far_args::Args;
using far_args::Refusal;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::vector<int64_t> sizes_of(const executorch::runtime::TensorInfo& info) {
  std::vector<int64_t> out;
  for (int32_t d : info.sizes()) out.push_back(d);
  return out;
}

// Which tensor each input of train.pte's "forward" takes.
enum class Role { Hidden, InputIds, AttentionMask, TokenTypeIds, Labels };

Role role_of(const std::string& name) {
  if (name == "hidden" || name == "hidden_states") return Role::Hidden;
  if (name == "input_ids") return Role::InputIds;
  if (name == "attention_mask") return Role::AttentionMask;
  if (name == "token_type_ids") return Role::TokenTypeIds;
  if (name == "labels") return Role::Labels;
  throw Refusal("manifest.json names a train.pte input '" + name + "' far_train does not know");
}

// Without names in the manifest: (hidden, mask, labels) behind a bottom; else (ids, mask, [token types], labels).
std::vector<Role> infer_roles(size_t n_inputs, bool has_bottom) {
  if (has_bottom && n_inputs == 3) return {Role::Hidden, Role::AttentionMask, Role::Labels};
  if (!has_bottom && n_inputs == 4) return {Role::InputIds, Role::AttentionMask, Role::TokenTypeIds, Role::Labels};
  if (!has_bottom && n_inputs == 3) return {Role::InputIds, Role::AttentionMask, Role::Labels};
  throw Refusal("train.pte's forward takes " + std::to_string(n_inputs) + " inputs; far_train expects " +
                (has_bottom ? "3 (hidden, attention_mask, labels)" : "3 or 4 (input_ids, attention_mask, [token_type_ids], labels)") +
                " or their names in manifest.json's programs.train.inputs");
}

// One trainable tensor: where the program keeps it and its gradient, its optimizer slots, and (with
// micro-batches) the sum of its gradients over a step.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  float* data = nullptr;  // the program's live parameter (an output aliasing planned memory)
  size_t grad_output = 0, param_output = 0;
  std::vector<std::vector<float>> slots;  // optimizer.h's slots() order
  std::vector<float> grad_sum;
  float* grad = nullptr;  // this step's (mean) gradient
};

int run(int argc, char** argv) {
  const Args args = far_args::parse_args(argc, argv);
  executorch::runtime::runtime_init();
  if (args.threads > 0)
    executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(static_cast<uint32_t>(args.threads));

  // ---- everything is checked before the first step ----
  const far_manifest::Manifest manifest = far_manifest::read(args.out_dir);
  for (const far_manifest::Program* p : {&manifest.train, &manifest.bottom}) {
    if (p->file.empty()) continue;
    if (!exists(manifest.path(*p))) throw Refusal(args.out_dir + " lacks its program " + p->file);
    if (far_sha256::file_hexdigest(manifest.path(*p)) != p->sha256)
      throw Refusal(manifest.path(*p) + " is not the program manifest.json records (its sha256 differs: changed or "
                    "damaged since the export); export the folder again");
  }
  const std::string out_folder =
      args.state_out.find('/') == std::string::npos ? "." : args.state_out.substr(0, args.state_out.rfind('/') + 1);
  if (::access(out_folder.c_str(), W_OK) != 0)
    throw Refusal("cannot write " + args.state_out + " (its folder " + out_folder + " is missing or read-only)");
  const bool resuming_from_out = args.resume && args.state_out != args.state && exists(args.state_out);
  far_state::State state = far_state::read(resuming_from_out ? args.state_out : args.state, manifest);
  const std::string state_path = state.path;
  const auto examples_file = far_examples::read(args.examples, manifest.max_length);
  const far_examples::Examples& examples = *examples_file;
  const std::string examples_sha = far_sha256::file_hexdigest(args.examples);

  if (!examples.base_fingerprint.empty() && examples.base_fingerprint != manifest.base_fingerprint)
    throw Refusal(args.examples + " was written for another export (another base model); write it for " + args.out_dir);
  if (examples.float_label() != manifest.regression)
    throw Refusal(args.examples + " has " + (examples.float_label() ? "float32" : "integer") + " labels; the program " +
                  "trains " + (manifest.regression ? "a regression (float32 labels)" : "a classifier (int64 class ids)"));
  for (int64_t i = 0; i < examples.n && manifest.num_labels > 0 && !manifest.regression; ++i)
    if (examples.int_labels[i] < 0 || examples.int_labels[i] >= manifest.num_labels)
      throw Refusal(args.examples + ": example " + std::to_string(i) + " has label " +
                    std::to_string(examples.int_labels[i]) + ", not a class id of the program (0-" +
                    std::to_string(manifest.num_labels - 1) + ")");

  const int64_t B = manifest.batch_size, K = manifest.accumulate;  // the programs' batch; micro-batches per step
  if (examples.n < B * K)
    throw Refusal(args.examples + " has " + std::to_string(examples.n) + " examples, fewer than a step's " +
                  std::to_string(B * K) + " (short batches are dropped, so nothing would train)");
  const int64_t per_epoch = examples.n / (B * K);
  const int64_t total = args.max_steps > 0 ? std::min(args.epochs * per_epoch, args.max_steps) : args.epochs * per_epoch;

  // Where to start: the state's step, in the order of the run that wrote it (epoch, batch = divmod(step, per_epoch)).
  if (args.seed_given && state.step > 0 && args.seed != state.order_seed)
    throw Refusal(state_path + " is at step " + std::to_string(state.step) + " of a run with order_seed " +
                  std::to_string(state.order_seed) + "; --seed " + std::to_string(args.seed) +
                  " would change its order (drop --seed to resume it)");
  const uint64_t seed = args.seed_given ? args.seed : state.order_seed;
  if (state.step > 0 && state.examples_sha256 != examples_sha)
    throw Refusal(state_path + " is at step " + std::to_string(state.step) + " of a run on another examples file; pass "
                  "the same --examples to resume it, or start from the export's state.safetensors");
  const std::vector<std::string> slot_names = far_optim::slots(manifest.optimizer);
  const bool has_slots = !slot_names.empty() && state.slot(slot_names[0], manifest.trainable.front().name) != nullptr;
  if (!slot_names.empty() && state.step > 0 && !has_slots)
    throw Refusal(state_path + " is at step " + std::to_string(state.step) + " but holds no " + manifest.optimizer.name +
                  " state; resuming without it would not be the same run");

  // The programs, mapped read-only; the trainable parameters live in planned memory (checked below).
  far_et::LoadedProgram train(manifest.path(manifest.train));
  std::unique_ptr<far_et::LoadedProgram> bottom;
  if (manifest.has_bottom())
    bottom = std::make_unique<far_et::LoadedProgram>(manifest.path(manifest.bottom));
  for (const char* meta : {"__et_training_gradients_index_forward", "__et_training_parameters_index_forward"})
    if (!train.has_method(meta))
      throw Refusal(train.path() + " has no method " + meta + ": not a training program (export it with far)");
  const int64_t grad_start = train.meta_int("__et_training_gradients_index_forward");
  const int64_t param_start = train.meta_int("__et_training_parameters_index_forward");
  const int64_t n_params = param_start - grad_start;
  if (n_params != static_cast<int64_t>(manifest.trainable.size()))
    throw Refusal(train.path() + " trains " + std::to_string(n_params) + " tensors, manifest.json lists " +
                  std::to_string(manifest.trainable.size()));
  if (train.has_method("__et_training_fqn_forward")) {
    train.run_meta("__et_training_fqn_forward", [&](Method& m) {
      for (size_t i = 0; i < m.outputs_size() && i < manifest.trainable.size(); ++i)
        if (std::string(m.get_output(i).toString()) != manifest.trainable[i].name)
          throw Refusal(train.path() + " trains '" + std::string(m.get_output(i).toString()) + "' as tensor " +
                        std::to_string(i) + ", manifest.json says '" + manifest.trainable[i].name + "'");
    });
  }

  Method& fwd = train.load_forward();
  const auto meta = train.forward_meta();
  std::vector<Role> roles;
  if (!manifest.inputs.empty()) {
    for (const auto& n : manifest.inputs) roles.push_back(role_of(n));
    if (roles.size() != meta.num_inputs())
      throw Refusal("manifest.json names " + std::to_string(roles.size()) + " inputs, train.pte takes " +
                    std::to_string(meta.num_inputs()));
  } else {
    roles = infer_roles(meta.num_inputs(), bottom != nullptr);
  }
  int64_t L = 0;
  for (size_t i = 0; i < roles.size(); ++i) {
    const auto info = meta.input_tensor_meta(i).get();
    const auto sz = sizes_of(info);
    if (sz.empty() || sz[0] != B)
      throw Refusal("train.pte's input " + std::to_string(i) + " has shape " + far_st::shape_str(sz) +
                    ", not batch_size " + std::to_string(B) + " first");
    if (roles[i] == Role::Labels) {
      if ((info.scalar_type() == ScalarType::Float) != examples.float_label())
        throw Refusal("train.pte takes " + std::string(examples.float_label() ? "int64" : "float32") + " labels, " +
                      args.examples + " holds " + (examples.float_label() ? "float32" : "int64") + " ones");
    } else if (sz.size() >= 2) {
      L = sz[1];
    }
  }
  if (L != manifest.max_length)
    throw Refusal("train.pte takes sequences of " + std::to_string(L) + " tokens, manifest.json says max_length " +
                  std::to_string(manifest.max_length));

  // Parameters: outputs [param_start, param_start + n) alias the live weights; gradients sit at grad_start.
  std::vector<Param> params(static_cast<size_t>(n_params));
  for (int64_t i = 0; i < n_params; ++i) {
    Param& p = params[i];
    p.name = manifest.trainable[i].name;
    p.grad_output = static_cast<size_t>(grad_start + i);
    p.param_output = static_cast<size_t>(param_start + i);
    auto t = fwd.get_output(p.param_output).toTensor();
    if (t.scalar_type() != ScalarType::Float) throw Refusal(train.path() + ": '" + p.name + "' is not float32");
    for (auto d : t.sizes()) p.shape.push_back(d);
    p.numel = t.numel();
    p.data = t.mutable_data_ptr<float>();
    if (!train.in_planned(p.data, p.numel * sizeof(float)))
      throw Refusal(train.path() + ": parameter '" + p.name + "' is not in planned (writable) memory; "
                    "far_train needs the parameters exported as mutable, memory-planned tensors");
    if (state.tensor(p.name).shape != p.shape)
      throw Refusal(state_path + ": '" + p.name + "' has shape " + far_st::shape_str(state.tensor(p.name).shape) +
                    ", the program's is " + far_st::shape_str(p.shape));
  }
  // Copy the state in. Parameters are written before the first execution; see et_program.h for why that works.
  for (Param& p : params) {
    std::memcpy(p.data, state.tensor(p.name).data, p.numel * sizeof(float));
    for (const std::string& slot : slot_names) {
      p.slots.emplace_back(static_cast<size_t>(p.numel), 0.f);
      if (const far_st::Tensor* held = state.slot(slot, p.name))
        std::memcpy(p.slots.back().data(), held->data, p.numel * sizeof(float));
    }
    if (K > 1) p.grad_sum.assign(static_cast<size_t>(p.numel), 0.f);
  }
  bool slots_started = has_slots;
  state.file = far_st::File();  // unmap it: its values live in the program now

  // Batch buffers, and the tensors over them that feed the programs.
  int64_t bottom_inputs = 0;
  if (bottom) {
    bottom->load_forward();
    bottom_inputs = static_cast<int64_t>(bottom->forward_meta().num_inputs());
    auto hidden = sizes_of(bottom->forward_meta().output_tensor_meta(0).get());
    for (size_t i = 0; i < roles.size(); ++i)
      if (roles[i] == Role::Hidden && hidden != sizes_of(meta.input_tensor_meta(i).get()))
        throw Refusal("bottom.pte returns " + far_st::shape_str(hidden) + ", train.pte takes hidden states of " +
                      far_st::shape_str(sizes_of(meta.input_tensor_meta(i).get())));
  }
  far_examples::Batch batch(B, L);
  using executorch::extension::make_tensor_ptr;
  auto ids_t = make_tensor_ptr({int32_t(B), int32_t(L)}, batch.input_ids.data(), ScalarType::Long);
  auto mask_t = make_tensor_ptr({int32_t(B), int32_t(L)}, batch.attention_mask.data(), ScalarType::Long);
  auto tt_t = make_tensor_ptr({int32_t(B), int32_t(L)}, batch.token_type_ids.data(), ScalarType::Long);
  auto labels_t = examples.float_label() ? make_tensor_ptr({int32_t(B)}, batch.float_labels.data(), ScalarType::Float)
                                         : make_tensor_ptr({int32_t(B)}, batch.int_labels.data(), ScalarType::Long);
  auto set = [](Method& m, size_t i, const EValue& v, const std::string& what) {
    auto e = m.set_input(v, i);
    if (e != executorch::runtime::Error::Ok)
      throw std::runtime_error("cannot set input " + std::to_string(i) + " of " + what + " (ExecuTorch error " +
                               far_et::error_name(e) + ")");
  };

  int64_t n_values = 0;
  for (const Param& p : params) n_values += p.numel;
  std::printf("far_train: %s (planned %.1f MB)%s; %zu trainable tensors (%lld values); %s; batch %lld x %lld in %lld "
              "micro-batch(es); %lld examples -> %lld batches/epoch (%lld left over each epoch); from step %lld to step "
              "%lld; order_seed %llu\n",
              train.path().c_str(), train.planned_bytes() / 1e6,
              bottom ? fmt(", bottom.pte (planned %.1f MB)", bottom->planned_bytes() / 1e6).c_str() : "", params.size(),
              (long long)n_values, manifest.optimizer.name.c_str(), (long long)(B * K), (long long)L, (long long)K,
              (long long)examples.n, (long long)per_epoch, (long long)(examples.n - per_epoch * B * K),
              (long long)state.step, (long long)total, (unsigned long long)seed);
  std::fflush(stdout);

  int64_t step = state.step;
  auto checkpoint = [&]() {
    std::vector<far_st::TensorView> views;
    for (const Param& p : params) views.push_back({p.name, "F32", p.shape, p.data});
    if (slots_started)
      for (size_t s = 0; s < slot_names.size(); ++s)
        for (const Param& p : params) views.push_back({slot_names[s] + ":" + p.name, "F32", p.shape, p.slots[s].data()});
    far_state::write(args.state_out, manifest, views, step, step / per_epoch, step % per_epoch, seed,
                     step > 0 ? examples_sha : "");
  };

  // What a step reads of the mapped files is given back after it (pages.h), so resident memory holds one step's.
  std::vector<std::string> mapped = {manifest.path(manifest.train), args.examples};
  if (bottom) mapped.push_back(manifest.path(manifest.bottom));
  const far_pages::FilePages file_pages(mapped);

  // ---- training ----
  try {
    std::vector<int64_t> order;
    int64_t order_epoch = -1;
    while (step < total) {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t epoch = step / per_epoch, next = step % per_epoch;  // batch `next` of `epoch`
      if (epoch != order_epoch) {
        order = far_examples::epoch_order(seed, epoch, examples.n);
        order_epoch = epoch;
      }
      float loss = 0.f;
      for (int64_t part = 0; part < K; ++part) {  // each gradient is a micro-batch mean: their mean is the step's
        for (int64_t r = 0; r < B; ++r)
          batch.set_row(r, examples, order[(next * K + part) * B + r], manifest.pad_token_id);
        if (bottom) {  // frozen bottom: tokens -> hidden states, forward only
          Method& bm = bottom->forward();
          set(bm, 0, EValue(*ids_t), "bottom.pte");
          set(bm, 1, EValue(*mask_t), "bottom.pte");
          if (bottom_inputs > 2) set(bm, 2, EValue(*tt_t), "bottom.pte");
          bottom->execute();
          file_pages.release();  // the embedding rows (and, on the first step, the weights XNNPACK packed)
        }
        for (size_t i = 0; i < roles.size(); ++i) {
          switch (roles[i]) {
            case Role::Hidden: set(fwd, i, bottom->forward().get_output(0), "train.pte"); break;
            case Role::InputIds: set(fwd, i, EValue(*ids_t), "train.pte"); break;
            case Role::AttentionMask: set(fwd, i, EValue(*mask_t), "train.pte"); break;
            case Role::TokenTypeIds: set(fwd, i, EValue(*tt_t), "train.pte"); break;
            case Role::Labels: set(fwd, i, EValue(*labels_t), "train.pte"); break;
          }
        }
        train.execute();
        const float part_loss = fwd.get_output(0).toTensor().const_data_ptr<float>()[0];
        if (!std::isfinite(part_loss))
          throw std::runtime_error("loss is " + std::to_string(part_loss) + " at step " + std::to_string(step + 1) +
                                   "; stopping (" + args.state_out + " keeps the last checkpoint)");
        loss += part_loss / static_cast<float>(K);
        for (Param& p : params) {
          if (fwd.get_output(p.param_output).toTensor().const_data_ptr<float>() != p.data)
            throw std::runtime_error("'" + p.name + "' moved during execution; its output no longer aliases the weight");
          float* g = fwd.get_output(p.grad_output).toTensor().mutable_data_ptr<float>();
          if (K == 1) {
            p.grad = g;
          } else if (part == 0) {
            std::memcpy(p.grad_sum.data(), g, p.numel * sizeof(float));
          } else {
            for (int64_t i = 0; i < p.numel; ++i) p.grad_sum[i] += g[i];
          }
        }
      }
      if (K > 1)
        for (Param& p : params) {
          for (int64_t i = 0; i < p.numel; ++i) p.grad_sum[i] /= static_cast<float>(K);
          p.grad = p.grad_sum.data();
        }
      if (manifest.optimizer.max_grad_norm > 0) {
        std::vector<std::pair<float*, int64_t>> grads;
        for (Param& p : params) grads.emplace_back(p.grad, p.numel);
        const float factor = far_optim::clip_factor(grads, manifest.optimizer.max_grad_norm);
        for (Param& p : params)
          for (int64_t i = 0; i < p.numel; ++i) p.grad[i] *= factor;
      }
      const double lr = far_optim::lr_at(manifest.optimizer, step, total);
      for (Param& p : params) {
        std::vector<float*> slots;
        for (auto& s : p.slots) slots.push_back(s.data());
        far_optim::step(manifest.optimizer, lr, step + 1, p.data, p.grad, slots, !slots_started, p.numel);
      }
      slots_started = !slot_names.empty();
      file_pages.release();
      ++step;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step=%lld epoch=%lld loss=%.6f time_s=%.3f\n", (long long)step, (long long)epoch, loss, secs);
      if (args.checkpoint_every > 0 && step % args.checkpoint_every == 0 && step < total) {
        checkpoint();
        std::printf("checkpoint step=%lld %s\n", (long long)step, args.state_out.c_str());
      }
      std::fflush(stdout);
    }
    checkpoint();
    std::printf("done step=%lld %s\n", (long long)step, args.state_out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "far_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Refusal& e) {
    std::fprintf(stderr, "far_train: refused: %s\n", e.what());
  } catch (const std::exception& e) {  // a bad file found before training (format, manifest, program)
    std::fprintf(stderr, "far_train: refused: %s\n", e.what());
  }
  std::fputs("(nothing was trained; see far_train --help)\n", stderr);
  return 2;
}
