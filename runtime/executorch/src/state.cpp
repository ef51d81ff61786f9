#include "far/state.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "far/optimizer.h"
#include "far/sha256.h"

namespace far {

namespace {

const std::string kFormat = "far.device.state", kVersion = "1", kContent = "content_sha256";

int64_t whole_number(const safetensors::File& f, const std::string& key, const std::string& path) {
  const std::string v = f.meta(key);
  char* end = nullptr;
  errno = 0;
  const long long n = v.empty() ? -1 : std::strtoll(v.c_str(), &end, 10);
  // strtoll saturates past 2**63 - 1 (ERANGE) and skips leading spaces: neither is a number far wrote.
  if (v.empty() || *end || n < 0 || errno == ERANGE || !std::isdigit(static_cast<unsigned char>(v[0]))) throw StateError(path + ": " + key + "='" + v + "' is not a whole number");
  return n;
}

// Every tensor is a trainable one of the manifest or one of the optimizer's slots of one, of its shape.
void check_tensors(const State& s, const Manifest& m) {
  const safetensors::File& f = s.file;
  std::set<std::string> expected;
  for (const auto& spec : m.trainable) expected.insert(spec.name);
  const std::vector<std::string> slot_names = optim::slots(m.optimizer);
  std::set<std::string> slots_held;
  for (const auto& t : f.tensors) {
    if (expected.count(t.name)) continue;
    const size_t colon = t.name.find(':');
    const std::string slot = colon == std::string::npos ? "" : t.name.substr(0, colon);
    if (colon == std::string::npos || !expected.count(t.name.substr(colon + 1)) ||
        std::find(slot_names.begin(), slot_names.end(), slot) == slot_names.end())
      throw StateError(s.path + " holds '" + t.name + "', which this export does not train with " + m.optimizer.name +
                       " (a state of another export?)");
    slots_held.insert(slot);
  }
  for (const auto& spec : m.trainable) {
    std::vector<std::string> names = {spec.name};
    for (const auto& slot : slots_held) names.push_back(slot + ":" + spec.name);
    for (const std::string& name : names) {
      const safetensors::Tensor* t = f.find(name);
      if (!t) throw StateError(s.path + " has no tensor '" + name + "'");
      if (t->dtype != "F32" || (!spec.shape.empty() && t->shape != spec.shape))
        throw StateError(s.path + ": '" + name + "' has shape " + safetensors::shape_str(t->shape) + " " +
                         safetensors::torch_dtype(t->dtype) + ", the manifest says " +
                         safetensors::shape_str(spec.shape) + " float32");
    }
  }
}

StateError unreadable(const safetensors::FormatError& e) {
  return StateError(std::string(e.what()) + "; resume from an intact state file, or start again from the export's "
                    "state.safetensors");
}

}  // namespace

std::string content_sha256(const std::map<std::string, std::string>& metadata,
                           const std::vector<safetensors::TensorView>& tensors) {
  const std::string nul(1, '\0');
  Sha256 h;
  h.update("far.device.state/1\n");
  for (const auto& [key, value] : metadata)  // std::map: keys in byte order
    if (key != kContent) h.update("meta" + nul + key + nul + value + "\n");
  std::vector<const safetensors::TensorView*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const auto* t : sorted) {
    std::string dims;
    for (size_t i = 0; i < t->shape.size(); ++i) dims += (i ? "," : "") + std::to_string(t->shape[i]);
    h.update("tensor" + nul + t->name + nul + safetensors::torch_dtype(t->dtype) + nul + dims + "\n");
    h.update(t->data, static_cast<size_t>(safetensors::numel(t->shape)) * safetensors::dtype_size(t->dtype));
  }
  return h.hexdigest();
}

State read_state(const std::string& path, const Manifest& m) {
  std::shared_ptr<safetensors::Mapping> bytes;
  try {
    bytes = std::make_shared<safetensors::Mapping>(path);
  } catch (const safetensors::FormatError& e) {
    throw unreadable(e);
  }
  return read_state(bytes, path, m);
}

State read_state(std::shared_ptr<safetensors::Mapping> bytes, const std::string& path, const Manifest& m) {
  State s;
  s.path = path;
  try {
    s.file = safetensors::parse(std::move(bytes), path);
  } catch (const safetensors::FormatError& e) {
    throw unreadable(e);
  }
  const safetensors::File& f = s.file;
  if (f.meta("format") != kFormat || f.meta("format_version") != kVersion)
    throw StateError(path + " is not a far.device training state of version " + kVersion + " (format '" +
                     f.meta("format") + "', version '" + f.meta("format_version") + "')");
  std::vector<safetensors::TensorView> views;
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
  check_tensors(s, m);
  s.step = whole_number(f, "step", path);
  s.epoch = whole_number(f, "epoch", path);
  s.batch = whole_number(f, "batch", path);
  s.order_seed = static_cast<uint64_t>(whole_number(f, "order_seed", path));
  s.examples_sha256 = f.meta("examples_sha256");
  return s;
}

void write_state(const std::string& path, const Manifest& m, const std::vector<safetensors::TensorView>& tensors,
                 const Progress& progress) {
  std::map<std::string, std::string> meta = {
      {"format", kFormat},
      {"format_version", kVersion},
      {"base_fingerprint", m.base_fingerprint},
      {"program_sha256", m.train.sha256},
      {"step", std::to_string(progress.step)},
      {"epoch", std::to_string(progress.epoch)},
      {"batch", std::to_string(progress.batch)},
      {"order_seed", std::to_string(progress.order_seed)},
      {"examples_sha256", progress.examples_sha256},
  };
  meta[kContent] = content_sha256(meta, tensors);
  safetensors::write_atomic(path, tensors, meta);
}

}  // namespace far
