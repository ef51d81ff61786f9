// The checks of far_train's inputs that read files and the manifest, not the programs' memory: which input
// takes what, the programs against the manifest, the examples against the program, a resumed state against
// its run. Each throws Refusal (exit status 2) before anything is written.
#include <unistd.h>

#include "far/json.h"
#include "far/trainer.h"

namespace far {

Role role_of(const std::string& name) {
  if (name == "hidden" || name == "hidden_states") return Role::Hidden;
  if (name == "input_ids") return Role::InputIds;
  if (name == "attention_mask") return Role::AttentionMask;
  if (name == "token_type_ids") return Role::TokenTypeIds;
  if (name == "labels") return Role::Labels;
  throw Refusal("manifest.json names a train.pte input '" + name + "' far_train does not know");
}

std::vector<Role> infer_roles(size_t n_inputs, bool has_bottom) {
  if (has_bottom && n_inputs == 3) return {Role::Hidden, Role::AttentionMask, Role::Labels};
  if (!has_bottom && n_inputs == 4) return {Role::InputIds, Role::AttentionMask, Role::TokenTypeIds, Role::Labels};
  if (!has_bottom && n_inputs == 3) return {Role::InputIds, Role::AttentionMask, Role::Labels};
  throw Refusal("train.pte's forward takes " + std::to_string(n_inputs) + " inputs; far_train expects " +
                (has_bottom ? "3 (hidden, attention_mask, labels)"
                            : "3 or 4 (input_ids, attention_mask, [token_type_ids], labels)") +
                " or their names in manifest.json's programs.train.inputs");
}

// The programs are the ones the manifest names, and STATE_OUT can be written.
void Trainer::check_programs() const {
  for (const ProgramFile* p : {&manifest_.train, &manifest_.bottom}) {
    if (!p->file.empty()) manifest_.check_program(*p);
  }
  const std::string& out = args_.state_out;
  const std::string folder = out.find('/') == std::string::npos ? "." : out.substr(0, out.rfind('/') + 1);
  if (::access(folder.c_str(), W_OK) != 0)
    throw Refusal("cannot write " + out + " (its folder " + folder + " is missing or read-only)");
}

void Trainer::check_examples() const {
  const Examples& ex = *examples_;
  if (!ex.base_fingerprint.empty() && ex.base_fingerprint != manifest_.base_fingerprint)
    throw Refusal(args_.examples + " was written for another export (another base model); write it for " +
                  args_.out_dir);
  // Another task of the same base: its class count, or the same count under other names, are not this program's.
  if (!ex.num_labels.empty() && manifest_.num_labels > 0 && ex.num_labels != std::to_string(manifest_.num_labels))
    throw Refusal(args_.examples + " was written for another task (" + ex.num_labels + " classes; this program has " +
                  std::to_string(manifest_.num_labels) + "); write it for " + args_.out_dir);
  if (!ex.labels.empty() && !manifest_.labels.empty()) {
    Json names;
    try {
      names = parse_json(ex.labels);
    } catch (const std::exception&) {
      throw Refusal(args_.examples + ": its labels metadata is not a list of class names; write it again");
    }
    if (names != Json(manifest_.labels))
      throw Refusal(args_.examples + " was written for another export: its classes " + ex.labels +
                    " are not this program's " + Json(manifest_.labels).dump() + "; write it for " + args_.out_dir);
  }
  if (ex.float_label() != manifest_.regression)
    throw Refusal(args_.examples + " has " + (ex.float_label() ? "float32" : "integer") + " labels; the program " +
                  "trains " + (manifest_.regression ? "a regression (float32 labels)" : "a classifier (int64 class ids)"));
  for (int64_t i = 0; i < ex.n && manifest_.num_labels > 0 && !manifest_.regression; ++i)
    if (ex.int_labels[i] < 0 || ex.int_labels[i] >= manifest_.num_labels)
      throw Refusal(args_.examples + ": example " + std::to_string(i) + " has label " + std::to_string(ex.int_labels[i]) +
                    ", not a class id of the program (0-" + std::to_string(manifest_.num_labels - 1) + ")");
}

// A state past step 0 goes on in the order, on the examples and with the optimizer state it was trained with.
void Trainer::check_resume() const {
  const std::string at = state_.path + " is at step " + std::to_string(state_.step);
  if (args_.seed_given && state_.step > 0 && args_.seed != state_.order_seed)
    throw Refusal(at + " of a run with order_seed " + std::to_string(state_.order_seed) + "; --seed " +
                  std::to_string(args_.seed) + " would change its order (drop --seed to resume it)");
  if (state_.step > 0 && state_.examples_sha256 != examples_sha_)
    throw Refusal(at + " of a run on another examples file; pass the same --examples to resume it, or start from the "
                  "export's state.safetensors");
  if (!slot_names_.empty() && state_.step > 0 && !state_.slot(slot_names_[0], manifest_.trainable.front().name))
    throw Refusal(at + " but holds no " + manifest_.optimizer.name +
                  " state; resuming without it would not be the same run");
}

}  // namespace far
