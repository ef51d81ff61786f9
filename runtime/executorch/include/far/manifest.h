// OUT/manifest.json, as `far export --executorch OUT` (far/device/export.py) writes it: what the runner needs
// to know about the programs beside it (the manifest holds more: the model, its learners, the tokenizer).
// The key names live here (src/manifest.cpp) and nowhere else.
//
//   {"format": "far.device", "format_version": 2,
//    "batch_size": 32, "micro_batch_size": 8, "accumulate": 4, "max_length": 64,   // the programs take 8

//    "task": {"kind": "classification", "num_labels": 2},                       // or "regression"
//    // a causal LM's export (far export --model NAME) instead: "objective": "next_token", "vocab_size": 49152,
//    // "hidden_size": 576, and train.pte's inputs are (hidden, input_ids): chunks of text, no labels
//    "programs": {"train": {"file": "train.pte", "sha256": "...",
//                           "inputs": [{"name": "hidden", "shape": [...], "dtype": "float32"}, ...]},
//                 "bottom": {"file": "bottom.pte", "sha256": "...", "inputs": [...]}},  // with a frozen bottom
//    "trainable": [{"name": "...", "shape": [384, 384], "dtype": "float32"}, ...],     // program order
//    "optimizer": {"name": "adamw", "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0,
//                  "max_grad_norm": 1.0,                                          // or null
//                  "schedule": {"kind": "linear", "warmup_steps": 0, "total_steps": null, "offset": 0}},  // or null
//                 // or {"name": "sgd", "lr": 0.01, "momentum": 0.9, "dampening": 0, "weight_decay": 0, "nesterov": false, ...}
//    "base_fingerprint": "...",
//    "tokenizer": {"pad_token_id": 0, ...}}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace far {

struct OptimizerSettings {
  std::string name = "sgd";  // or "adamw"
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double max_grad_norm = 0;  // 0: no clipping
  bool linear_schedule = false;
  int64_t warmup_steps = 0, total_steps = 0, offset = 0;  // total_steps 0: offset + the run's steps
};

struct ProgramFile {
  std::string file, sha256;  // file relative to the folder; "" when there is no such program
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // empty when the manifest gives names only
};

struct Manifest {
  std::string dir;  // the OUT folder
  int64_t batch_size = 0, max_length = 0, pad_token_id = 0;  // batch_size: the programs' (a micro-batch)
  int64_t accumulate = 1;                                      // micro-batches per optimizer step
  std::vector<TensorSpec> trainable;  // in the program's parameter order
  OptimizerSettings optimizer;
  std::string base_fingerprint;
  ProgramFile train, bottom;
  std::vector<std::string> inputs;  // train.pte's "forward" inputs by name; empty: inferred by the runner
  bool regression = false;
  int64_t num_labels = 0;  // 0: not recorded
  std::vector<std::string> labels;  // the class names in id order; empty: not recorded
  bool next_token = false;          // "objective": "next_token": a causal LM trained on chunks of text
  int64_t vocab_size = 0, hidden_size = 0;  // recorded for next_token
  // A causal LM's greedy decoding step (far export --generate): "programs": {"generate": {...}} and
  // "generate": {"cache_length": 256}; "tokenizer": {"eos_token_id": 2}. Empty, 0 and -1 without them.
  ProgramFile generate;
  int64_t cache_length = 0, eos_token_id = -1;

  std::string path(const ProgramFile& p) const { return dir + "/" + p.file; }
  // Refusal unless `p` is in the folder with the sha256 this manifest records (not changed or damaged since).
  void check_program(const ProgramFile& p) const;
  bool has_bottom() const { return !bottom.file.empty(); }
};

// Read `dir`/manifest.json; std::runtime_error naming the file and the key at fault.
Manifest read_manifest(const std::string& dir);

// The manifest held by `text` (what read_manifest reads), for a folder `dir`.
Manifest parse_manifest(const std::string& text, const std::string& dir);

}  // namespace far
