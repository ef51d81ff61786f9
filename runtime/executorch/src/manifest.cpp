#include "far/manifest.h"

#include <unistd.h>

#include <fstream>
#include <stdexcept>

#include "far/args.h"
#include "far/json.h"
#include "far/sha256.h"

namespace far {

namespace {

// Typed access to one JSON object of the manifest; errors name the file and the key.
class Reader {
 public:
  Reader(const Json& obj, std::string where, std::string file) : obj_(obj), where_(std::move(where)), file_(std::move(file)) {}

  std::runtime_error fail(const std::string& what) const { return std::runtime_error(file_ + ": " + what); }
  const Json* find(const char* key) const {
    if (!obj_.is_object()) return nullptr;
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const char* key, bool required, int64_t fallback = 0) const {
    const Json* v = find(key);
    if (!v) {
      if (required) throw fail("missing " + name(key));
      return fallback;
    }
    if (!v->is_number_integer()) throw fail(name(key) + " is not an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw fail(name(key) + " is out of range");
    return v->get<int64_t>();
  }
  double number(const char* key, bool required) const {
    const Json* v = find(key);
    if (!v) {
      if (required) throw fail("missing " + name(key));
      return 0.0;
    }
    if (!v->is_number()) throw fail(name(key) + " is not a number");
    return v->get<double>();
  }
  std::string string(const char* key) const {
    const Json* v = find(key);
    if (!v || !v->is_string()) throw fail("missing string " + name(key));
    return v->get<std::string>();
  }

  const std::string& file() const { return file_; }

 private:
  std::string name(const char* key) const { return where_ + "\"" + key + "\""; }
  const Json& obj_;
  std::string where_, file_;
};

// The name of a "trainable" entry or a program input: a string, or an object with a "name".
const Json* entry_name(const Json& entry) {
  if (entry.is_string()) return &entry;
  if (entry.is_object() && entry.contains("name") && entry["name"].is_string()) return &entry["name"];
  return nullptr;
}

void read_trainable(const Reader& root, Manifest& m) {
  const Json* trainable = root.find("trainable");
  if (!trainable || !trainable->is_array() || trainable->empty()) throw root.fail("missing \"trainable\" list");
  for (const auto& t : *trainable) {
    const Json* name = entry_name(t);
    if (!name) throw root.fail("\"trainable\" holds an entry without a name");
    TensorSpec spec{name->get<std::string>(), {}};
    if (t.is_object() && t.contains("shape")) {
      if (!t["shape"].is_array()) throw root.fail("bad shape of '" + spec.name + "'");
      for (const auto& d : t["shape"]) {
        uint64_t dim = 0;
        if (!whole_number(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX))
          throw root.fail("bad shape of '" + spec.name + "'");
        spec.shape.push_back(static_cast<int64_t>(dim));
      }
    }
    if (t.is_object() && t.contains("dtype") && t["dtype"] != "float32")
      throw root.fail("'" + spec.name + "' is " + t["dtype"].dump() + "; far_train trains float32 tensors only");
    m.trainable.push_back(spec);
  }
}

void read_programs(const Reader& root, Manifest& m) {
  const Json* programs = root.find("programs");
  if (!programs || !programs->is_object()) throw root.fail("missing \"programs\" (an export by an older far? export again)");
  for (const auto& [key, program] : programs->items()) {
    if (!program.is_object() || !program.contains("file") || !program["file"].is_string() ||
        !program.contains("sha256") || !program["sha256"].is_string())
      throw root.fail("program '" + key + "' needs \"file\" and \"sha256\"");
    const ProgramFile file{program["file"].get<std::string>(), program["sha256"].get<std::string>()};
    if (key == "train") {
      m.train = file;
      if (program.contains("inputs")) {
        if (!program["inputs"].is_array()) throw root.fail("the train program's \"inputs\" is not a list");
        for (const auto& spec : program["inputs"]) {
          const Json* name = entry_name(spec);
          if (!name) throw root.fail("an input of the train program has no name");
          m.inputs.push_back(name->get<std::string>());
        }
      }
    } else if (key == "bottom") {
      m.bottom = file;
    } else if (key == "generate") {
      m.generate = file;
    }
  }
  if (m.train.file.empty()) throw root.fail("\"programs\" has no \"train\" program");
}

void read_optimizer(const Reader& root, Manifest& m) {
  const Json* opt = root.find("optimizer");
  if (!opt || !opt->is_object()) throw root.fail("missing \"optimizer\" object");
  const Reader o(*opt, "\"optimizer\".", root.file());
  OptimizerSettings& s = m.optimizer;
  s.name = o.string("name");
  if (s.name != "sgd" && s.name != "adamw")
    throw o.fail("optimizer \"" + s.name + "\" is not supported by far_train (\"sgd\" or \"adamw\")");
  s.lr = o.number("lr", true);
  s.weight_decay = o.number("weight_decay", false);
  if (s.name == "sgd") {
    s.momentum = o.number("momentum", false);
    s.dampening = o.number("dampening", false);
    if (const Json* n = o.find("nesterov")) s.nesterov = n->is_boolean() && n->get<bool>();
  } else {
    const Json* betas = o.find("betas");
    if (!betas || !betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() || !(*betas)[1].is_number())
      throw o.fail("\"optimizer\".\"betas\" must be two numbers");
    s.beta1 = (*betas)[0].get<double>();
    s.beta2 = (*betas)[1].get<double>();
    s.eps = o.number("eps", true);
  }
  if (o.find("max_grad_norm")) {
    s.max_grad_norm = o.number("max_grad_norm", true);
    if (s.max_grad_norm <= 0) throw o.fail("\"optimizer\".\"max_grad_norm\" must be positive or null");
  }
  if (const Json* sch = o.find("schedule")) {
    if (!sch->is_object() || !sch->contains("kind") || (*sch)["kind"] != "linear")
      throw o.fail("\"optimizer\".\"schedule\" must be null or of kind \"linear\"");
    const Reader r(*sch, "\"optimizer\".\"schedule\".", root.file());
    s.linear_schedule = true;
    s.warmup_steps = r.integer("warmup_steps", true);
    s.offset = r.integer("offset", true);
    s.total_steps = r.integer("total_steps", false, 0);
    if (s.warmup_steps < 0 || s.offset < 0 || s.total_steps < 0)
      throw o.fail("\"optimizer\".\"schedule\"'s steps must not be negative");
  }
  if (s.lr <= 0) throw o.fail("\"optimizer\".\"lr\" must be positive");
}

}  // namespace

Manifest parse_manifest(const std::string& text, const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  Json json;
  try {
    json = parse_json(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (!json.is_object()) throw std::runtime_error(path + ": not a JSON object");
  const Reader root(json, "", path);
  if (const Json* format = root.find("format")) {
    if (!format->is_string() || *format != "far.device")
      throw root.fail("not a far.device manifest (format " + format->dump() + ")");
    if (const int64_t version = root.integer("format_version", true); version != 2)
      throw root.fail("format_version " + std::to_string(version) +
                      "; far_train reads version 2: rebuild far_train from this far, or export again");
  }
  Manifest m;
  m.dir = dir;
  m.batch_size = root.integer("micro_batch_size", true);
  m.accumulate = root.integer("accumulate", true);
  m.max_length = root.integer("max_length", true);
  if (const Json* tok = root.find("tokenizer")) {
    const Reader t(*tok, "\"tokenizer\".", path);
    m.pad_token_id = t.integer("pad_token_id", false, 0);
    m.eos_token_id = t.integer("eos_token_id", false, -1);
  }
  if (const Json* generate = root.find("generate")) {
    m.cache_length = Reader(*generate, "\"generate\".", path).integer("cache_length", true);
    if (m.cache_length <= 0 || m.cache_length > (1 << 16)) throw root.fail("\"generate\".cache_length must be 1 to 65536");
  }
  if (m.batch_size <= 0 || m.accumulate <= 0 || m.max_length <= 0)
    throw root.fail("micro_batch_size, accumulate and max_length must be positive");
  // Compared as a quotient: micro_batch_size x accumulate may not fit in 64 bits.
  const int64_t batch_size = root.integer("batch_size", true);
  if (batch_size % m.batch_size != 0 || batch_size / m.batch_size != m.accumulate)
    throw root.fail("batch_size is not micro_batch_size x accumulate");
  m.base_fingerprint = root.string("base_fingerprint");
  if (const Json* task = root.find("task")) {
    const Reader t(*task, "\"task\".", path);
    const Json* kind = t.find("kind");
    m.regression = kind && *kind == "regression";
    m.num_labels = t.integer("num_labels", false, 0);
    if (const Json* names = t.find("labels")) {
      if (!names->is_array() || names->size() > (1u << 20)) throw t.fail("\"task\".labels is not a list of class names");
      for (const Json& name : *names) {
        if (!name.is_string()) throw t.fail("\"task\".labels holds something other than class names");
        m.labels.push_back(name.get<std::string>());
      }
    }
  }
  if (const Json* objective = root.find("objective")) {
    if (!objective->is_string() || (*objective != "next_token" && *objective != "classification"))
      throw root.fail("\"objective\" " + objective->dump().substr(0, 80) +
                      " is not one far_train trains (\"classification\" or \"next_token\")");
    m.next_token = *objective == "next_token";
  }
  if (m.next_token) {
    m.vocab_size = root.integer("vocab_size", true);
    m.hidden_size = root.integer("hidden_size", true);
    if (m.vocab_size <= 0 || m.vocab_size > INT32_MAX || m.hidden_size <= 0)
      throw root.fail("vocab_size and hidden_size must be positive (and the vocabulary fit int32 ids)");
  }
  read_trainable(root, m);
  read_programs(root, m);
  read_optimizer(root, m);
  return m;
}

void Manifest::check_program(const ProgramFile& p) const {
  if (::access(path(p).c_str(), F_OK) != 0) throw Refusal(dir + " lacks its program " + p.file);
  if (file_sha256(path(p)) != p.sha256)
    throw Refusal(path(p) + " is not the program manifest.json records (its sha256 differs: changed or damaged "
                  "since the export); export the folder again");
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error(path + ": cannot open (is " + dir + " a folder written by `far export --executorch`?)");
  // Read exactly the file's bytes, and refuse a size no manifest has (a few KB, a few hundred KB with long
  // lists of tensor names) before allocating for it.
  constexpr std::streamoff kMaxBytes = 64 << 20;
  const std::streamoff size = f.tellg();
  if (size < 0 || size > kMaxBytes)
    throw std::runtime_error(path + ": " + std::to_string(static_cast<long long>(size)) + " bytes is not a manifest " +
                             "(far's are far below " + std::to_string(kMaxBytes >> 20) + " MiB); export the folder again");
  std::string text(static_cast<size_t>(size), '\0');
  f.seekg(0);
  if (!f.read(text.data(), size)) throw std::runtime_error(path + ": cannot read");
  return parse_manifest(text, dir);
}

}  // namespace far
