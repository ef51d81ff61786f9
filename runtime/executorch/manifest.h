// OUT/manifest.json, as `far export --executorch OUT` (far/device/export.py) writes it: what the runner needs
// to know about the programs beside it (the manifest holds more: the model, its learners, the tokenizer).
// The key names live here and nowhere else.
//
//   {"format": "far.device", "format_version": 1,
//    "batch_size": 32, "max_length": 64,
//    "task": {"kind": "classification", "num_labels": 2},                       // or "regression"
//    "programs": {"train": {"file": "train.pte", "sha256": "...",
//                           "inputs": [{"name": "hidden", "shape": [...], "dtype": "float32"}, ...]},
//                 "bottom": {"file": "bottom.pte", "sha256": "...", "inputs": [...]}},  // with a frozen bottom
//    "trainable": [{"name": "...", "shape": [384, 384], "dtype": "float32"}, ...],     // program order
//    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0, "weight_decay": 0, "nesterov": false},
//    "base_fingerprint": "...",
//    "tokenizer": {"pad_token_id": 0, ...}}
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.h"

namespace far_manifest {

struct Optimizer {
  std::string name = "sgd";
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

struct Program {
  std::string file, sha256;  // file relative to the folder; "" when there is no such program
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // empty when the manifest gives names only
};

struct Manifest {
  std::string dir;  // the OUT folder
  int64_t batch_size = 0, max_length = 0, pad_token_id = 0;
  std::vector<TensorSpec> trainable;  // in the program's parameter order
  Optimizer optimizer;
  std::string base_fingerprint;
  Program train, bottom;
  std::vector<std::string> inputs;  // train.pte's "forward" inputs by name; empty: inferred by the runner
  bool regression = false;
  int64_t num_labels = 0;  // 0: not recorded

  std::string path(const Program& p) const { return dir + "/" + p.file; }
  bool has_bottom() const { return !bottom.file.empty(); }
};

inline Manifest read(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  auto fail = [&](const std::string& what) { return std::runtime_error(path + ": " + what); };
  std::ifstream f(path);
  if (!f) throw fail("cannot open (is " + dir + " a folder written by `far export --executorch`?)");
  std::stringstream text;
  text << f.rdbuf();
  far_json::Value root;
  try {
    root = far_json::parse(text.str());
  } catch (const std::exception& e) {
    throw fail(e.what());
  }
  if (!root.is_object()) throw fail("not a JSON object");

  auto integer = [&](const far_json::Value& obj, const char* key, bool required, int64_t fallback) {
    const far_json::Value* v = obj.find(key);
    if (!v) {
      if (required) throw fail(std::string("missing \"") + key + "\"");
      return fallback;
    }
    if (!v->is_integer) throw fail(std::string("\"") + key + "\" is not an integer");
    return v->integer;
  };
  auto number = [&](const far_json::Value& obj, const char* key, bool required) {
    const far_json::Value* v = obj.find(key);
    if (!v) {
      if (required) throw fail(std::string("missing \"optimizer\".\"") + key + "\"");
      return 0.0;
    }
    if (!v->is_number()) throw fail(std::string("\"optimizer\".\"") + key + "\" is not a number");
    return v->number;
  };
  auto string = [&](const char* key) -> std::string {
    const far_json::Value* v = root.find(key);
    if (!v || !v->is_string()) throw fail(std::string("missing string \"") + key + "\"");
    return v->string;
  };

  if (const far_json::Value* format = root.find("format")) {
    if (!format->is_string() || format->string != "far.device")
      throw fail("not a far.device manifest (format '" + format->string + "')");
    if (integer(root, "format_version", true, 0) != 1)
      throw fail("format_version " + std::to_string(integer(root, "format_version", true, 0)) +
                 "; far_train reads version 1: rebuild far_train from this far, or export again");
  }

  Manifest m;
  m.dir = dir;
  m.batch_size = integer(root, "batch_size", true, 0);
  m.max_length = integer(root, "max_length", true, 0);
  if (const far_json::Value* tok = root.find("tokenizer")) m.pad_token_id = integer(*tok, "pad_token_id", false, 0);
  if (m.batch_size <= 0 || m.max_length <= 0) throw fail("batch_size and max_length must be positive");
  m.base_fingerprint = string("base_fingerprint");
  if (const far_json::Value* task = root.find("task")) {
    const far_json::Value* kind = task->find("kind");
    m.regression = kind && kind->string == "regression";
    m.num_labels = integer(*task, "num_labels", false, 0);
  }

  const far_json::Value* trainable = root.find("trainable");
  if (!trainable || !trainable->is_array() || trainable->array.empty()) throw fail("missing \"trainable\" list");
  for (const auto& t : trainable->array) {
    TensorSpec spec;
    const far_json::Value* name = t.is_string() ? &t : t.find("name");
    if (!name || !name->is_string()) throw fail("\"trainable\" holds an entry without a name");
    spec.name = name->string;
    if (const far_json::Value* shape = t.is_object() ? t.find("shape") : nullptr) {
      for (const auto& d : shape->array) {
        if (!d.is_integer) throw fail("bad shape of '" + spec.name + "'");
        spec.shape.push_back(d.integer);
      }
    }
    if (const far_json::Value* dtype = t.is_object() ? t.find("dtype") : nullptr)
      if (dtype->string != "float32")
        throw fail("'" + spec.name + "' is " + dtype->string + "; far_train trains float32 tensors only");
    m.trainable.push_back(spec);
  }

  const far_json::Value* programs = root.find("programs");
  if (programs && programs->is_object()) {
    for (const auto& kv : programs->object) {
      const far_json::Value *file = kv.second.find("file"), *sha = kv.second.find("sha256");
      if (!file || !file->is_string() || !sha || !sha->is_string())
        throw fail("program '" + kv.first + "' needs \"file\" and \"sha256\"");
      if (kv.first == "train") {
        m.train = {file->string, sha->string};
        if (const far_json::Value* inputs = kv.second.find("inputs"))
          for (const auto& spec : inputs->array) {
            const far_json::Value* name = spec.is_string() ? &spec : spec.find("name");
            if (!name || !name->is_string()) throw fail("an input of the train program has no name");
            m.inputs.push_back(name->string);
          }
      } else if (kv.first == "bottom") {
        m.bottom = {file->string, sha->string};
      }
    }
    if (m.train.file.empty()) throw fail("\"programs\" has no \"train\" program");
  } else {
    throw fail("missing \"programs\" (an export by an older far? export again)");
  }

  const far_json::Value* opt = root.find("optimizer");
  if (!opt || !opt->is_object()) throw fail("missing \"optimizer\" object");
  const far_json::Value* name = opt->find("name");
  if (!name || !name->is_string()) throw fail("missing \"optimizer\".\"name\"");
  m.optimizer.name = name->string;
  if (m.optimizer.name != "sgd")
    throw fail("optimizer \"" + m.optimizer.name + "\" is not supported by far_train (only \"sgd\"); export with SGD");
  m.optimizer.lr = number(*opt, "lr", true);
  m.optimizer.momentum = number(*opt, "momentum", false);
  m.optimizer.dampening = number(*opt, "dampening", false);
  m.optimizer.weight_decay = number(*opt, "weight_decay", false);
  if (const far_json::Value* n = opt->find("nesterov")) m.optimizer.nesterov = n->boolean;
  if (m.optimizer.lr <= 0) throw fail("\"optimizer\".\"lr\" must be positive");
  return m;
}

}  // namespace far_manifest
