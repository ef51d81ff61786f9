// The training state file (far.device.state, format version 1), as far/device/state.py defines it: one
// safetensors file holding
//   <name>            float32, each trainable tensor, named and shaped as the manifest's "trainable" list;
//   <slot>:<name>     float32, its optimizer state once a step was taken: "momentum" (SGD with momentum),
//                     "exp_avg" and "exp_avg_sq" (AdamW) -- far::optim::slots();
//   metadata          format "far.device.state", format_version "1", base_fingerprint, program_sha256, step
//                     (optimizer steps taken), epoch and batch (the next batch: batch `batch` of epoch `epoch`),
//                     order_seed, examples_sha256 ("" before training) and content_sha256.
// content_sha256 = sha256 of "far.device.state/1\n", then for each metadata entry but itself, keys in byte
// order, "meta\0<key>\0<value>\n", then for each tensor, names in byte order,
// "tensor\0<name>\0<torch dtype>\0<d0,d1,...>\n" and its raw bytes: a flipped byte anywhere is caught.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "far/manifest.h"
#include "far/safetensors.h"

namespace far {

// A state that cannot be used with this export: damaged, foreign, or another run's.
struct StateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct State {
  std::string path;
  safetensors::File file;
  int64_t step = 0, epoch = 0, batch = 0;
  uint64_t order_seed = 0;
  std::string examples_sha256;

  const safetensors::Tensor& tensor(const std::string& name) const { return *file.find(name); }
  // The optimizer's `slot` of tensor `name`, or nullptr before the first step.
  const safetensors::Tensor* slot(const std::string& slot, const std::string& name) const {
    return file.find(slot + ":" + name);
  }
};

// Where a run stands, as a state file records it.
struct Progress {
  int64_t step = 0, epoch = 0, batch = 0;
  uint64_t order_seed = 0;
  std::string examples_sha256;  // "" before training
};

// The state's content_sha256 (see above) over `metadata` (its own entry left out) and `tensors`.
std::string content_sha256(const std::map<std::string, std::string>& metadata,
                           const std::vector<safetensors::TensorView>& tensors);

// Read `path` and check it belongs to the export `m` describes, before any of it is used; StateError if not.
State read_state(const std::string& path, const Manifest& m);
// The same over bytes already in memory (`path` names them in errors).
State read_state(std::shared_ptr<safetensors::Mapping> bytes, const std::string& path, const Manifest& m);

// Write a state atomically (safetensors::write_atomic): `tensors` are the trainable tensors then the slots.
void write_state(const std::string& path, const Manifest& m, const std::vector<safetensors::TensorView>& tensors,
                 const Progress& progress);

}  // namespace far
