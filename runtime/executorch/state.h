// The training state file (far.device.state, format version 1), as far/device/state.py defines it: one
// safetensors file holding
//   <name>            float32, each trainable tensor, named and shaped as the manifest's "trainable" list;
//   <slot>:<name>     float32, its optimizer state once a step was taken: "momentum" (SGD with momentum),
//                     "exp_avg" and "exp_avg_sq" (AdamW) -- optimizer.h's slots();
//   metadata          format "far.device.state", format_version "1", base_fingerprint, program_sha256, step
//                     (optimizer steps taken), epoch and batch (the next batch: batch `batch` of epoch `epoch`),
//                     order_seed, examples_sha256 ("" before training) and content_sha256.
// content_sha256 = sha256 of "far.device.state/1\n", then for each metadata entry but itself, keys in byte
// order, "meta\0<key>\0<value>\n", then for each tensor, names in byte order,
// "tensor\0<name>\0<torch dtype>\0<d0,d1,...>\n" and its raw bytes: a flipped byte anywhere is caught.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "manifest.h"
#include "optimizer.h"
#include "safetensors.h"
#include "sha256.h"

namespace far_state {

const std::string kFormat = "far.device.state", kVersion = "1", kContent = "content_sha256";

// A state that cannot be used with this export: damaged, foreign, or another run's.
struct StateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::string torch_dtype(const std::string& st_dtype) {
  static const std::map<std::string, std::string> names = {
      {"F64", "float64"}, {"F32", "float32"}, {"F16", "float16"}, {"BF16", "bfloat16"}, {"I64", "int64"},
      {"I32", "int32"},   {"I16", "int16"},   {"I8", "int8"},     {"U8", "uint8"},     {"BOOL", "bool"}};
  auto it = names.find(st_dtype);
  return it == names.end() ? st_dtype : it->second;
}

inline std::string content_sha256(const std::map<std::string, std::string>& metadata,
                                  const std::vector<far_st::TensorView>& tensors) {
  far_sha256::Sha256 h;
  auto put = [&](const std::string& s) { h.update(reinterpret_cast<const uint8_t*>(s.data()), s.size()); };
  put("far.device.state/1\n");
  for (const auto& kv : metadata)  // std::map: keys in byte order
    if (kv.first != kContent) put("meta" + std::string(1, '\0') + kv.first + std::string(1, '\0') + kv.second + "\n");
  std::vector<const far_st::TensorView*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const auto* t : sorted) {
    std::string dims;
    for (size_t i = 0; i < t->shape.size(); ++i) dims += (i ? "," : "") + std::to_string(t->shape[i]);
    put("tensor" + std::string(1, '\0') + t->name + std::string(1, '\0') + torch_dtype(t->dtype) + std::string(1, '\0') +
        dims + "\n");
    h.update(static_cast<const uint8_t*>(t->data),
             static_cast<size_t>(far_st::numel(t->shape)) * far_st::dtype_size(t->dtype));
  }
  return h.hexdigest();
}

struct State {
  std::string path;
  far_st::File file;
  int64_t step = 0, epoch = 0, batch = 0;
  uint64_t order_seed = 0;
  std::string examples_sha256;

  const far_st::Tensor& tensor(const std::string& name) const { return *file.find(name); }
  // The optimizer's `slot` of tensor `name`, or nullptr before the first step.
  const far_st::Tensor* slot(const std::string& slot, const std::string& name) const { return file.find(slot + ":" + name); }
};

inline int64_t whole_number(const far_st::File& f, const std::string& key, const std::string& path) {
  const std::string v = f.meta(key);
  char* end = nullptr;
  long long n = v.empty() ? -1 : std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || n < 0) throw StateError(path + ": " + key + "='" + v + "' is not a whole number");
  return n;
}

// Read `path` and check it belongs to the export `m` describes, before any of it is used.
inline State read(const std::string& path, const far_manifest::Manifest& m) {
  State s;
  s.path = path;
  try {
    s.file = far_st::read(path);
  } catch (const far_st::FormatError& e) {
    throw StateError(std::string(e.what()) + "; resume from an intact state file, or start again from the export's "
                     "state.safetensors");
  }
  const far_st::File& f = s.file;
  if (f.meta("format") != kFormat || f.meta("format_version") != kVersion)
    throw StateError(path + " is not a far.device training state of version " + kVersion + " (format '" +
                     f.meta("format") + "', version '" + f.meta("format_version") + "')");
  std::vector<far_st::TensorView> views;
  for (const auto& t : f.tensors) views.push_back({t.name, t.dtype, t.shape, t.data});
  if (f.meta(kContent) != content_sha256(f.metadata, views))
    throw StateError(path + " is damaged: its contents do not match the sha256 recorded when it was written");
  if (f.meta("base_fingerprint") != m.base_fingerprint)
    throw StateError(path + " belongs to another base model than this export (base fingerprints differ); use the "
                     "state file written for " + m.dir);
  if (f.meta("program_sha256") != m.train.sha256)
    throw StateError(path + " was written for another training program (program_sha256 " + f.meta("program_sha256") +
                     ", " + m.dir + "/" + m.train.file + " is " + m.train.sha256 + "); use the state file written for " +
                     m.dir);
  std::set<std::string> expected;
  for (const auto& spec : m.trainable) expected.insert(spec.name);
  const std::vector<std::string> slot_names = far_optim::slots(m.optimizer);
  std::set<std::string> slots_held;
  for (const auto& t : f.tensors) {
    if (expected.count(t.name)) continue;
    const size_t colon = t.name.find(':');
    const std::string slot = colon == std::string::npos ? "" : t.name.substr(0, colon);
    if (colon == std::string::npos || !expected.count(t.name.substr(colon + 1)) ||
        std::find(slot_names.begin(), slot_names.end(), slot) == slot_names.end())
      throw StateError(path + " holds '" + t.name + "', which this export does not train with " + m.optimizer.name +
                       " (a state of another export?)");
    slots_held.insert(slot);
  }
  for (const auto& spec : m.trainable) {
    std::vector<std::string> names = {spec.name};
    for (const auto& slot : slots_held) names.push_back(slot + ":" + spec.name);
    for (const std::string& name : names) {
      const far_st::Tensor* t = f.find(name);
      if (!t) throw StateError(path + " has no tensor '" + name + "'");
      if (t->dtype != "F32" || (!spec.shape.empty() && t->shape != spec.shape))
        throw StateError(path + ": '" + name + "' has shape " + far_st::shape_str(t->shape) + " " + torch_dtype(t->dtype) +
                         ", the manifest says " + far_st::shape_str(spec.shape) + " float32");
    }
  }
  s.step = whole_number(f, "step", path);
  s.epoch = whole_number(f, "epoch", path);
  s.batch = whole_number(f, "batch", path);
  s.order_seed = static_cast<uint64_t>(whole_number(f, "order_seed", path));
  s.examples_sha256 = f.meta("examples_sha256");
  return s;
}

// Write a state atomically (see safetensors.h): `tensors` are the trainable tensors then the optimizer's slots.
inline void write(const std::string& path, const far_manifest::Manifest& m, const std::vector<far_st::TensorView>& tensors,
                  int64_t step, int64_t epoch, int64_t batch, uint64_t order_seed, const std::string& examples_sha256) {
  std::map<std::string, std::string> meta = {
      {"format", kFormat},
      {"format_version", kVersion},
      {"base_fingerprint", m.base_fingerprint},
      {"program_sha256", m.train.sha256},
      {"step", std::to_string(step)},
      {"epoch", std::to_string(epoch)},
      {"batch", std::to_string(batch)},
      {"order_seed", std::to_string(order_seed)},
      {"examples_sha256", examples_sha256},
  };
  meta[kContent] = content_sha256(meta, tensors);
  far_st::write_atomic(path, tensors, meta);
}

}  // namespace far_state
