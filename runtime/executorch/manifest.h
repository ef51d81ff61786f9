// OUT/manifest.json, as `far export --executorch OUT` (far/device/export.py) writes it: what the runner needs
// to know about the programs beside it (the manifest holds more: the model, its learners, the tokenizer).
// The key names live here and nowhere else.
//
//   {"format": "far.device", "format_version": 2,
//    "batch_size": 32, "micro_batch_size": 8, "accumulate": 4, "max_length": 64,   // the programs take 8

//    "task": {"kind": "classification", "num_labels": 2},                       // or "regression"
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
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.h"

namespace far_manifest {

struct Optimizer {
  std::string name = "sgd";  // or "adamw"
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double max_grad_norm = 0;  // 0: no clipping
  bool linear_schedule = false;
  int64_t warmup_steps = 0, total_steps = 0, offset = 0;  // total_steps 0: offset + the run's steps
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
  int64_t batch_size = 0, max_length = 0, pad_token_id = 0;  // batch_size: the programs' (a micro-batch)
  int64_t accumulate = 1;                                      // micro-batches per optimizer step
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
    if (integer(root, "format_version", true, 0) != 2)
      throw fail("format_version " + std::to_string(integer(root, "format_version", true, 0)) +
                 "; far_train reads version 2: rebuild far_train from this far, or export again");
  }

  Manifest m;
  m.dir = dir;
  m.batch_size = integer(root, "micro_batch_size", true, 0);
  m.accumulate = integer(root, "accumulate", true, 0);
  m.max_length = integer(root, "max_length", true, 0);
  if (const far_json::Value* tok = root.find("tokenizer")) m.pad_token_id = integer(*tok, "pad_token_id", false, 0);
  if (m.batch_size <= 0 || m.accumulate <= 0 || m.max_length <= 0)
    throw fail("micro_batch_size, accumulate and max_length must be positive");
  if (integer(root, "batch_size", true, 0) != m.batch_size * m.accumulate)
    throw fail("batch_size is not micro_batch_size x accumulate");
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
  if (m.optimizer.name != "sgd" && m.optimizer.name != "adamw")
    throw fail("optimizer \"" + m.optimizer.name + "\" is not supported by far_train (\"sgd\" or \"adamw\")");
  m.optimizer.lr = number(*opt, "lr", true);
  m.optimizer.weight_decay = number(*opt, "weight_decay", false);
  if (m.optimizer.name == "sgd") {
    m.optimizer.momentum = number(*opt, "momentum", false);
    m.optimizer.dampening = number(*opt, "dampening", false);
    if (const far_json::Value* n = opt->find("nesterov")) m.optimizer.nesterov = n->boolean;
  } else {
    const far_json::Value* betas = opt->find("betas");
    if (!betas || !betas->is_array() || betas->array.size() != 2 || !betas->array[0].is_number() ||
        !betas->array[1].is_number())
      throw fail("\"optimizer\".\"betas\" must be two numbers");
    m.optimizer.beta1 = betas->array[0].number;
    m.optimizer.beta2 = betas->array[1].number;
    m.optimizer.eps = number(*opt, "eps", true);
  }
  if (const far_json::Value* clip = opt->find("max_grad_norm"); clip && clip->kind != far_json::Value::Kind::Null) {
    if (!clip->is_number() || clip->number <= 0) throw fail("\"optimizer\".\"max_grad_norm\" must be positive or null");
    m.optimizer.max_grad_norm = clip->number;
  }
  if (const far_json::Value* sch = opt->find("schedule"); sch && sch->kind != far_json::Value::Kind::Null) {
    const far_json::Value* kind = sch->find("kind");
    if (!kind || kind->string != "linear") throw fail("\"optimizer\".\"schedule\" must be null or of kind \"linear\"");
    m.optimizer.linear_schedule = true;
    m.optimizer.warmup_steps = integer(*sch, "warmup_steps", true, 0);
    m.optimizer.offset = integer(*sch, "offset", true, 0);
    const far_json::Value* total = sch->find("total_steps");
    if (total && total->kind != far_json::Value::Kind::Null) m.optimizer.total_steps = integer(*sch, "total_steps", true, 0);
  }
  if (m.optimizer.lr <= 0) throw fail("\"optimizer\".\"lr\" must be positive");
  return m;
}

}  // namespace far_manifest
