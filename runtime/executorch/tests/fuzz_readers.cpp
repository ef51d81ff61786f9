// The readers of files from strangers, fed mutated inputs: each must be accepted, or refused with far's error
// type and a message; never crash, trip a sanitizer, or allocate from a number in the file.
//
//   fuzz_readers [--seed S] [--count N] [--reader R] [--regressions DIR] [--crash-file PATH] [--save DIR]
//
// R is one of json, safetensors, state, manifest, examples, chunks, sha256, or all (the default): N inputs each. Input i
// of reader R is a function of (S, R, i) alone, so a finding is replayed by its three numbers. --regressions
// DIR first feeds every file DIR/<reader>-*.bin to its reader (findings kept as files). --crash-file PATH
// holds the input being read, so a crash (or a sanitizer's abort) leaves it behind; --save DIR keeps each
// input that made a finding, as DIR/<reader>-<sha256 prefix>.bin.
// Built plain by CTest (a few hundred inputs), with -DFAR_SANITIZE=ON by tests/test_device_fuzz.py, and as a
// libFuzzer target with -DFAR_LIBFUZZER=ON under clang (README.md, Fuzzing the readers).
//
// Inputs start from valid files written by far's C++ writers (safetensors::header_text, write_state's
// content_sha256, manifests as far/device/export.py writes them), then are mutated: truncated, bits flipped,
// bytes spliced, the header length lied about, header numbers made absurd (shapes, offsets, counts past 2**63),
// keys repeated, values nested thousands deep; the state and examples also as whole files written with absurd
// contents and a correct seal, so the checks past the hash are reached.
#include <dirent.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "far/chunks.h"
#include "far/examples.h"
#include "far/json.h"
#include "far/manifest.h"
#include "far/safetensors.h"
#include "far/sha256.h"
#include "far/state.h"

#if defined(__GNUC__) && !defined(__clang__)
// operator new below is malloc, so free is its match; GCC cannot see that through the replacement.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

// ---- the largest single allocation while a reader runs (operator new is replaced for the whole program) ----

namespace {
size_t g_largest = 0;
}

void* operator new(size_t n) {
  if (n > g_largest) g_largest = n;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

using far::Json;
using far::safetensors::TensorView;
using Rng = std::mt19937_64;

const std::vector<std::string> kReaders = {"json", "safetensors", "state", "manifest", "examples", "chunks", "sha256"};

uint64_t pick(Rng& r, uint64_t n) { return n ? r() % n : 0; }

// Numbers a header should never be trusted with.
uint64_t absurd(Rng& r) {
  static const uint64_t values[] = {0, 1, 7, 8, 255, 4096, 0x7fffffffULL, 0xffffffffULL, 1ULL << 32, 1ULL << 40,
                                    1ULL << 53, (1ULL << 62) + 1, 0x7fffffffffffffffULL, 0x8000000000000000ULL,
                                    0xfffffffffffffff8ULL, 0xffffffffffffffffULL};
  return values[pick(r, sizeof(values) / sizeof(values[0]))] + (r() % 4 == 0 ? pick(r, 3) : 0);
}

Json absurd_json(Rng& r) {
  switch (pick(r, 9)) {
    case 0: return absurd(r);
    case 1: return -static_cast<int64_t>(pick(r, 1ULL << 62)) - 1;
    case 2: return 1e308 * (r() % 2 ? 1 : -1);
    case 3: return 0.5;
    case 4: return "12";
    case 5: return nullptr;
    case 6: return Json::array({absurd(r), absurd(r)});
    case 7: return Json::object();
    default: return std::string(pick(r, 40), static_cast<char>('a' + pick(r, 26)));
  }
}

// Some value inside `j` (a random walk down), to mutate in place.
Json* somewhere(Json& j, Rng& r) {
  Json* at = &j;
  for (int depth = 0; depth < 6 && (at->is_object() || at->is_array()) && !at->empty(); ++depth) {
    if (r() % 4 == 0) break;
    auto it = at->begin();
    std::advance(it, static_cast<long>(pick(r, at->size())));
    at = &*it;
  }
  return at;
}

// Every number inside `j` (counts, sizes, offsets, shapes: what a reader multiplies and allocates with).
void numbers(Json& j, std::vector<Json*>& out) {
  if (j.is_number()) out.push_back(&j);
  if (j.is_object() || j.is_array())
    for (auto& v : j) numbers(v, out);
}

// A structural mutation of a JSON value, returned as text (which may repeat a key or nest deep, which no
// Json value can hold).
std::string mutate_json(Json j, Rng& r) {
  switch (pick(r, 7)) {
    case 0: *somewhere(j, r) = absurd_json(r); return j.dump();
    case 6: {  // one to three of its numbers made absurd at once (two of them multiplied may overflow)
      std::vector<Json*> found;
      numbers(j, found);
      for (uint64_t k = pick(r, 3) + 1; k && !found.empty(); --k)
        *found[pick(r, found.size())] = r() % 4 ? Json(absurd(r)) : absurd_json(r);
      return j.dump();
    }
    case 1: {  // a shape or an offsets list of absurd numbers
      Json* at = somewhere(j, r);
      Json list = Json::array();
      for (uint64_t k = pick(r, 5) + 1; k; --k) list.push_back(absurd(r));
      *at = list;
      return j.dump();
    }
    case 2: {  // a key repeated: its entry written again at the end of its object
      std::string text = j.dump();
      const size_t q = text.find("\":", pick(r, text.size()));
      if (q == std::string::npos) return text;
      const size_t start = text.rfind('"', q - 1);
      const size_t close = text.rfind('}');
      if (start == std::string::npos || close == std::string::npos || close < q) return text;
      return text.substr(0, close) + "," + text.substr(start, q + 2 - start) + "0" + text.substr(close);
    }
    case 3: {  // deep nesting, past the reader's limit or just under it
      const size_t depth = r() % 2 ? 60 + pick(r, 10) : 1 + pick(r, 20000);
      const char open = r() % 2 ? '[' : '{';
      std::string inner;
      for (size_t k = 0; k < depth; ++k) inner += open == '[' ? "[" : "{\"a\":";
      inner += "1";
      for (size_t k = 0; k < depth; ++k) inner += open == '[' ? "]" : "}";
      *somewhere(j, r) = nullptr;
      std::string text = j.dump();
      const size_t at = text.find("null");
      return at == std::string::npos ? inner : text.replace(at, 4, inner);
    }
    case 4: {  // a key deleted
      Json* at = somewhere(j, r);
      if (at->is_object() && !at->empty()) {
        auto it = at->begin();
        std::advance(it, static_cast<long>(pick(r, at->size())));
        at->erase(it);
      }
      return j.dump();
    }
    default: {  // a string made of raw bytes (not UTF-8, quotes, NULs)
      std::string text = j.dump();
      const size_t at = pick(r, text.size() + 1);
      std::string junk;
      for (uint64_t k = pick(r, 6) + 1; k; --k) junk += static_cast<char>(r());
      return text.insert(at, junk);
    }
  }
}

// Byte-level mutations: truncation, flipped bits, bytes set or spliced.
std::string mutate_bytes(std::string b, Rng& r) {
  for (uint64_t rounds = pick(r, 3) + 1; rounds; --rounds) {
    switch (pick(r, 5)) {
      case 0: b.resize(pick(r, b.size() + 1)); break;
      case 1:
        for (uint64_t k = pick(r, 8) + 1; k && !b.empty(); --k) b[pick(r, b.size())] ^= static_cast<char>(1 << pick(r, 8));
        break;
      case 2:
        if (!b.empty()) b[pick(r, b.size())] = "\0\xff\x7f{}[]\",:0-9e"[pick(r, 15)];
        break;
      case 3: {  // a slice repeated or dropped
        if (b.empty()) break;
        const size_t at = pick(r, b.size()), n = pick(r, std::min<size_t>(64, b.size() - at) + 1);
        if (r() % 2) b.insert(at, b.substr(at, n));
        else b.erase(at, n);
        break;
      }
      default:
        for (uint64_t k = pick(r, 16) + 1; k; --k) b.insert(b.begin() + static_cast<long>(pick(r, b.size() + 1)), static_cast<char>(r()));
    }
  }
  return b;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

std::string safetensors_bytes(const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& meta) {
  const std::string header = far::safetensors::header_text(tensors, meta);
  std::string out = le64(header.size()) + header;
  for (const auto& t : tensors)
    out.append(static_cast<const char*>(t.data),
               static_cast<size_t>(far::safetensors::numel(t.shape)) * far::safetensors::dtype_size(t.dtype));
  return out;
}

// A safetensors file mutated: its bytes, or its header as JSON (then re-framed, with a true or a lying length).
std::string mutate_safetensors(const std::string& file, Rng& r) {
  if (r() % 3 == 0 || file.size() < 8) return mutate_bytes(file, r);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  const std::string header = file.substr(8, n), data = file.substr(8 + n);
  std::string text = header;
  if (r() % 4) {
    try {
      text = mutate_json(Json::parse(header), r);
    } catch (const Json::exception&) {
    }
  }
  uint64_t len = text.size();
  if (r() % 4 == 0) len = r() % 2 ? absurd(r) : len + pick(r, 17) - 8;  // the length lies
  std::string out = le64(len) + text + data;
  return r() % 4 == 0 ? mutate_bytes(out, r) : out;
}

// ---- the valid inputs ----

struct Seeds {
  far::Manifest manifest;  // the state's export
  std::string manifest_text, adamw_manifest_text;
  std::vector<std::string> states, examples, chunks, plain;
  std::vector<float> w, b, mw, mb;
};

Json manifest_json(const std::string& optimizer) {
  Json opt = {{"name", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0}, {"weight_decay", 0},
              {"nesterov", false}, {"max_grad_norm", nullptr}, {"schedule", nullptr}};
  if (optimizer == "adamw")
    opt = {{"name", "adamw"}, {"lr", 1e-4}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.01},
           {"max_grad_norm", 1.0}, {"schedule", {{"kind", "linear"}, {"warmup_steps", 2}, {"total_steps", nullptr}, {"offset", 0}}}};
  return {{"format", "far.device"}, {"format_version", 2}, {"batch_size", 8}, {"micro_batch_size", 4}, {"accumulate", 2},
          {"max_length", 8}, {"task", {{"kind", "classification"}, {"num_labels", 2}}},
          {"programs", {{"train", {{"file", "train.pte"}, {"sha256", "abc123"},
                                   {"inputs", {{{"name", "hidden"}, {"shape", {4, 8, 16}}, {"dtype", "float32"}}, "labels"}}}},
                        {"bottom", {{"file", "bottom.pte"}, {"sha256", "def456"}}}}},
          {"trainable", {{{"name", "w"}, {"shape", {2, 3}}, {"dtype", "float32"}}, {{"name", "b"}, {"shape", {3}}}}},
          {"optimizer", opt}, {"base_fingerprint", "base-1"}, {"tokenizer", {{"pad_token_id", 0}}}};
}

Seeds make_seeds() {
  Seeds s;
  s.manifest_text = manifest_json("sgd").dump(2);
  s.adamw_manifest_text = manifest_json("adamw").dump();
  s.manifest = far::parse_manifest(s.manifest_text, "OUT");
  s.w = {1, 2, 3, 4, 5, 6};
  s.b = {0.5f, -0.5f, 0.25f};
  s.mw = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  s.mb = {0, 0, 1};
  std::vector<TensorView> fresh = {{"w", "F32", {2, 3}, s.w.data()}, {"b", "F32", {3}, s.b.data()}};
  std::vector<TensorView> stepped = fresh;
  stepped.push_back({"momentum:w", "F32", {2, 3}, s.mw.data()});
  stepped.push_back({"momentum:b", "F32", {3}, s.mb.data()});
  for (const auto* tensors : {&fresh, &stepped}) {
    std::map<std::string, std::string> meta = {
        {"format", "far.device.state"}, {"format_version", "1"}, {"base_fingerprint", "base-1"},
        {"program_sha256", "abc123"}, {"step", tensors == &fresh ? "0" : "3"}, {"epoch", "0"}, {"batch", "3"},
        {"order_seed", "42"}, {"examples_sha256", tensors == &fresh ? "" : "feedbeef"}};
    meta["content_sha256"] = far::content_sha256(meta, *tensors);
    s.states.push_back(safetensors_bytes(*tensors, meta));
  }
  static const std::vector<int64_t> ids = {101, 7, 8, 102, 0, 101, 9, 102, 0, 0, 101, 5, 6, 7, 102};
  static const std::vector<int64_t> mask = {1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
  static const std::vector<int32_t> ids32 = {101, 7, 8, 102, 0, 101, 9, 102, 0, 0, 101, 5, 6, 7, 102};
  static const std::vector<int64_t> labels = {0, 1, 1};
  static const std::vector<float> scores = {0.5f, 2.5f, 4.f};
  s.examples.push_back(safetensors_bytes({{"input_ids", "I64", {3, 5}, ids.data()}, {"attention_mask", "I64", {3, 5}, mask.data()},
                                          {"token_type_ids", "I64", {3, 5}, mask.data()}, {"labels", "I64", {3}, labels.data()}},
                                         {{"base_fingerprint", "base-1"}}));
  s.examples.push_back(safetensors_bytes({{"input_ids", "I32", {3, 5}, ids32.data()}, {"attention_mask", "I64", {3, 5}, mask.data()},
                                          {"labels", "F32", {3}, scores.data()}}, {}));
  static const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2};
  s.chunks.push_back(safetensors_bytes({{"train", "I32", {2, 4}, tokens.data()}, {"held_out", "I32", {1, 4}, tokens.data() + 8}},
                                       {{"format", "far.device.chunks"}, {"format_version", "1"},
                                        {"base_fingerprint", "base-1"}, {"max_length", "4"}}));
  s.plain = s.states;
  s.plain.insert(s.plain.end(), s.examples.begin(), s.examples.end());
  s.plain.insert(s.plain.end(), s.chunks.begin(), s.chunks.end());
  static const uint8_t odd[7] = {1, 2, 3, 4, 5, 6, 7};
  s.plain.push_back(safetensors_bytes({{"a", "U8", {7}, odd}, {"e", "F64", {0, 3}, odd}, {"s", "BF16", {}, odd}}, {}));
  return s;
}

// A state written whole, sealed with its true content_sha256, with absurd contents where the checks past the
// hash look: metadata numbers, tensor names, shapes and dtypes.
std::string sealed_state(const Seeds& s, Rng& r) {
  std::map<std::string, std::string> meta = {
      {"format", "far.device.state"}, {"format_version", "1"}, {"base_fingerprint", "base-1"},
      {"program_sha256", "abc123"}, {"step", "3"}, {"epoch", "0"}, {"batch", "3"}, {"order_seed", "42"},
      {"examples_sha256", "feedbeef"}};
  static const char* numbers[] = {"-1", "99999999999999999999", "18446744073709551615", "9223372036854775807",
                                  " 3", "3 ", "+3", "0x10", "1e3", "", "3.5", "0"};
  for (const char* key : {"step", "epoch", "batch", "order_seed"})
    if (r() % 3 == 0) meta[key] = numbers[pick(r, sizeof(numbers) / sizeof(numbers[0]))];
  if (r() % 8 == 0) meta["format_version"] = std::to_string(pick(r, 3));
  static const std::vector<float> pool(64, 1.f);
  std::vector<TensorView> t = {{"w", "F32", {2, 3}, pool.data()}, {"b", "F32", {3}, pool.data()},
                               {"momentum:w", "F32", {2, 3}, pool.data()}, {"momentum:b", "F32", {3}, pool.data()}};
  static const char* names[] = {"w", "b", "momentum:w", ":w", "momentum:", "exp_avg:w", "momentum:x", "x", "w:momentum"};
  static const char* dtypes[] = {"F32", "F64", "I32", "U8", "BF16", "F16", "I64"};
  for (auto& v : t) {
    if (r() % 6 == 0) v.name = names[pick(r, sizeof(names) / sizeof(names[0]))];
    if (r() % 8 == 0) v.dtype = dtypes[pick(r, sizeof(dtypes) / sizeof(dtypes[0]))];
    if (r() % 6 == 0) v.shape = r() % 2 ? std::vector<int64_t>{static_cast<int64_t>(pick(r, 4)), 2}
                                        : std::vector<int64_t>{static_cast<int64_t>(absurd(r) >> 1), 0};
    if (far::safetensors::numel(v.shape) * static_cast<int64_t>(far::safetensors::dtype_size(v.dtype)) > 256) v.shape = {3};
  }
  if (r() % 4 == 0) t.resize(pick(r, t.size()));
  meta["content_sha256"] = far::content_sha256(meta, t);
  return safetensors_bytes(t, meta);
}

// An examples file written whole with absurd shapes, dtypes and values in its columns.
std::string odd_examples(Rng& r) {
  static const char* dtypes[] = {"I64", "I32", "F32", "U8", "F64"};
  const int64_t n = static_cast<int64_t>(pick(r, 5)), l = static_cast<int64_t>(pick(r, 6));
  std::vector<int64_t> values(64);
  for (auto& v : values) v = r() % 3 ? static_cast<int64_t>(pick(r, 3)) : static_cast<int64_t>(absurd(r));
  std::vector<TensorView> t;
  for (const char* name : {"input_ids", "attention_mask", "token_type_ids", "labels"}) {
    if (r() % 10 == 0) continue;
    std::vector<int64_t> shape = std::string(name) == "labels" ? std::vector<int64_t>{n} : std::vector<int64_t>{n, l};
    if (r() % 6 == 0) shape = r() % 2 ? std::vector<int64_t>{static_cast<int64_t>(absurd(r) >> 1), 0}
                                      : std::vector<int64_t>{static_cast<int64_t>(pick(r, 4))};
    const char* dtype = r() % 5 == 0 ? dtypes[pick(r, 5)] : (std::string(name) == "labels" && r() % 3 == 0 ? "F32" : "I64");
    if (far::safetensors::numel(shape) * static_cast<int64_t>(far::safetensors::dtype_size(dtype)) > 512) shape = {n, l};
    t.push_back({name, dtype, shape, values.data()});
  }
  std::map<std::string, std::string> meta;
  if (r() % 2) meta["base_fingerprint"] = r() % 2 ? "base-1" : "other";
  return safetensors_bytes(t, meta);
}

// ---- feeding one input to one reader ----

struct Tally {
  long inputs = 0, accepted = 0, refused = 0, findings = 0;
  size_t largest = 0, input_bytes_at_largest = 0;
};

std::string g_crash_file, g_save_dir;

void finding(const std::string& reader, const std::string& where, const std::string& what, const std::string& input,
             Tally& t) {
  ++t.findings;
  std::fprintf(stderr, "FINDING %s %s: %s (%zu bytes)\n", reader.c_str(), where.c_str(), what.c_str(), input.size());
  if (!g_save_dir.empty() && !input.empty()) {  // kept as a regression input: <reader>-<sha256 prefix>.bin
    far::Sha256 h;
    h.update(input);
    std::ofstream(g_save_dir + "/" + reader + "-" + h.hexdigest().substr(0, 12) + ".bin", std::ios::binary) << input;
  }
}

// Reads everything a caller may read of an accepted file: under ASan a bound the reader got wrong shows.
uint64_t touch(const far::safetensors::File& f) {
  uint64_t sum = 0;
  for (const auto& t : f.tensors)
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
  return sum;
}

// Run one input through `reader`, counting it as accepted, refused (with far's error type and a message that
// names the input) or a finding.
void feed(const std::string& reader, const std::string& where, const std::string& input, const Seeds& seeds, Tally& t) {
  ++t.inputs;
  if (!g_crash_file.empty()) std::ofstream(g_crash_file, std::ios::binary | std::ios::trunc) << input;
  const std::string name = "fuzz/" + reader + ".in";
  g_largest = 0;
  bool refused = false;
  try {
    if (reader == "json") {
      const Json j = far::parse_json(input);
      if (far::parse_json(j.dump()) != j) finding(reader, where, "does not read back its own dump", input, t);
    } else if (reader == "safetensors") {
      touch(far::safetensors::parse(far::safetensors::Mapping::copy_of(input), name));
    } else if (reader == "state") {
      const far::State s = far::read_state(far::safetensors::Mapping::copy_of(input), name, seeds.manifest);
      touch(s.file);
    } else if (reader == "manifest") {
      far::parse_manifest(input, "OUT");
    } else if (reader == "examples") {
      const auto ex = far::read_examples(far::safetensors::Mapping::copy_of(input), name, 8);
      far::Batch batch(2, 8);
      const std::vector<int64_t> order = far::epoch_order(7, 0, ex->n);
      for (int64_t i = 0; i < ex->n && i < 64; ++i) batch.set_row(i % 2, *ex, order[i], 0);
    } else if (reader == "chunks") {
      const auto c = far::read_chunks(far::safetensors::Mapping::copy_of(input), name, 4, 10, "base-1");
      int64_t sum = 0;
      for (int64_t row = 0; row < c->n_train + c->n_held_out && row < 64; ++row)
        for (int64_t j = 0; j < c->length; ++j) sum += c->id(row, j);
      if (sum < 0) finding(reader, where, "an id outside the vocabulary was accepted", input, t);
    } else {
      // SHA-256 over arbitrary bytes: one update, or the same bytes in random pieces, give one digest.
      std::mt19937_64 r(input.size());
      far::Sha256 whole, parts;
      whole.update(input);
      for (size_t at = 0; at < input.size();) {
        const size_t n = std::min<size_t>(input.size() - at, pick(r, 130));
        parts.update(input.data() + at, n);
        at += n;
      }
      const std::string d = whole.hexdigest();
      if (d.size() != 64 || d != parts.hexdigest()) finding(reader, where, "digest depends on how the bytes are fed", input, t);
    }
  } catch (const far::StateError& e) {
    refused = reader == "state" && std::strstr(e.what(), name.c_str());
    if (!refused) finding(reader, where, std::string("StateError without the file's name: ") + e.what(), input, t);
  } catch (const far::safetensors::FormatError& e) {
    refused = (reader == "safetensors" || reader == "examples" || reader == "chunks") &&
              std::strstr(e.what(), name.c_str());
    if (!refused) finding(reader, where, std::string("FormatError out of place: ") + e.what(), input, t);
  } catch (const std::runtime_error& e) {
    // parse_json and parse_manifest refuse with std::runtime_error, the examples reader too (naming the file).
    refused = (reader == "json" && std::strncmp(e.what(), "malformed JSON", 14) == 0) ||
              (reader == "manifest" && std::strncmp(e.what(), "OUT/manifest.json: ", 19) == 0) ||
              ((reader == "examples" || reader == "chunks") && std::strstr(e.what(), name.c_str()));
    if (!refused) finding(reader, where, std::string("runtime_error out of place: ") + e.what(), input, t);
  } catch (const std::exception& e) {
    finding(reader, where, std::string("escaped exception (not far's): ") + e.what(), input, t);
  }
  if (refused) ++t.refused;
  else ++t.accepted;
  // Every allocation is bounded by the bytes there are (a parsed JSON value takes several times its text).
  if (g_largest > t.largest) {
    t.largest = g_largest;
    t.input_bytes_at_largest = input.size();
  }
  if (g_largest > 16 * input.size() + (64 << 10))
    finding(reader, where, "allocated " + std::to_string(g_largest) + " bytes at once", input, t);
}

std::string generate(const std::string& reader, const Seeds& s, Rng& r) {
  if (reader == "json") {
    static const char* snippets[] = {"{}", "[]", "0", "\"\\ud800\"", "-0.0e-0", "[1e400]", "{\"a\":{\"a\":[]}}",
                                     "\"\\u0000\"", "18446744073709551616", "-9223372036854775809"};
    const uint64_t k = pick(r, 5);
    if (k == 0) return snippets[pick(r, 10)];
    if (k == 1) return mutate_bytes(r() % 2 ? s.manifest_text : s.adamw_manifest_text, r);
    const std::string& file = s.plain[pick(r, s.plain.size())];
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
    return mutate_json(Json::parse(file.substr(8, n)), r);
  }
  if (reader == "manifest") {
    const std::string& text = r() % 2 ? s.manifest_text : s.adamw_manifest_text;
    return r() % 3 ? mutate_json(Json::parse(text), r) : mutate_bytes(text, r);
  }
  if (reader == "safetensors") return mutate_safetensors(s.plain[pick(r, s.plain.size())], r);
  if (reader == "state") {
    if (r() % 3 == 0) return sealed_state(s, r);
    return mutate_safetensors(s.states[pick(r, s.states.size())], r);
  }
  if (reader == "chunks") return mutate_safetensors(s.chunks[pick(r, s.chunks.size())], r);
  if (reader == "examples") {
    if (r() % 3 == 0) return odd_examples(r);
    return mutate_safetensors(s.examples[pick(r, s.examples.size())], r);
  }
  std::string bytes(pick(r, 300), '\0');
  for (auto& c : bytes) c = static_cast<char>(r());
  return bytes;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

#ifdef FAR_LIBFUZZER
// libFuzzer (-DFAR_LIBFUZZER=ON, clang): the first byte picks the reader, the rest is the input; a finding
// aborts, so libFuzzer keeps the input as crash-<sha1>.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Seeds seeds = make_seeds();
  if (size == 0) return 0;
  const std::string& reader = kReaders[data[0] % kReaders.size()];
  Tally t;
  feed(reader, "libfuzzer", std::string(reinterpret_cast<const char*>(data) + 1, size - 1), seeds, t);
  if (t.findings) std::abort();
  return 0;
}
#else
int main(int argc, char** argv) {
  uint64_t seed = 1;
  long count = 1000;
  std::string only = "all", regressions;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--seed") seed = std::strtoull(value.c_str(), nullptr, 10);
    else if (flag == "--count") count = std::atol(value.c_str());
    else if (flag == "--reader") only = value;
    else if (flag == "--regressions") regressions = value;
    else if (flag == "--crash-file") g_crash_file = value;
    else if (flag == "--save") g_save_dir = value;
    else {
      std::fprintf(stderr, "usage: fuzz_readers [--seed S] [--count N] [--reader R] [--regressions DIR] [--crash-file PATH] [--save DIR]\n");
      return 2;
    }
  }
  const Seeds seeds = make_seeds();
  long findings = 0;
  for (size_t k = 0; k < kReaders.size(); ++k) {
    const std::string& reader = kReaders[k];
    if (only != "all" && only != reader) continue;
    Tally t;
    // The valid seeds themselves are accepted.
    if (reader == "state")
      for (const auto& f : seeds.states) far::read_state(far::safetensors::Mapping::copy_of(f), "seed", seeds.manifest);
    long regression_inputs = 0;
    if (!regressions.empty()) {
      if (DIR* d = ::opendir(regressions.c_str())) {
        while (const dirent* e = ::readdir(d)) {
          const std::string file = e->d_name;
          if (file.rfind(reader + "-", 0) == 0 && file.size() > 4 && file.substr(file.size() - 4) == ".bin") {
            // Each is a finding kept as a file: it must be refused, cleanly.
            const long refused = t.refused;
            feed(reader, file, read_file(regressions + "/" + file), seeds, t);
            if (t.refused == refused) finding(reader, file, "a regression input was not refused", "", t);
            ++regression_inputs;
          }
        }
        ::closedir(d);
      }
    }
    for (long i = 0; i < count; ++i) {
      Rng r(far::splitmix64(seed ^ far::splitmix64(k * 1000003ULL + static_cast<uint64_t>(i))));
      const std::string input = generate(reader, seeds, r);
      feed(reader, "seed=" + std::to_string(seed) + " input=" + std::to_string(i), input, seeds, t);
    }
    std::printf("%-12s inputs=%ld (regressions %ld) accepted=%ld refused=%ld findings=%ld largest_alloc=%zu (input %zu bytes)\n",
                reader.c_str(), t.inputs, regression_inputs, t.accepted, t.refused, t.findings, t.largest,
                t.input_bytes_at_largest);
    findings += t.findings;
  }
  if (!g_crash_file.empty()) std::remove(g_crash_file.c_str());
  std::printf("findings=%ld\n", findings);
  return findings == 0 ? 0 : 1;
}
#endif
