// The state reader (far::read_state) takes what far::write_state writes, and refuses, with a StateError that
// says what is wrong, every state it must not train from: damaged, truncated, of another base model or
// program, of other shapes, holding tensors of another export, or with broken metadata.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "far/json.h"
#include "far/manifest.h"
#include "far/state.h"

namespace {

using far::StateError;
using far::safetensors::TensorView;

far::Manifest manifest(const std::string& optimizer = "sgd", const std::string& fingerprint = "base-1",
                       const std::string& program_sha = "abc123", int64_t rows = 2) {
  far::Json opt = {{"name", optimizer}, {"lr", 0.1}, {"momentum", 0.9}};
  if (optimizer == "adamw") opt = {{"name", "adamw"}, {"lr", 0.1}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}};
  const far::Json m = {
      {"format", "far.device"}, {"format_version", 2}, {"batch_size", 4}, {"micro_batch_size", 4}, {"accumulate", 1},
      {"max_length", 8}, {"base_fingerprint", fingerprint},
      {"trainable", {{{"name", "w"}, {"shape", {rows, 3}}, {"dtype", "float32"}}, {{"name", "b"}, {"shape", {3}}}}},
      {"programs", {{"train", {{"file", "train.pte"}, {"sha256", program_sha}}}}}, {"optimizer", opt}};
  return far::parse_manifest(m.dump(), "OUT");
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void put_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct Fixture {
  std::string dir, path;
  std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {0.5f, -0.5f, 0.25f}, mw = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f},
                     mb = {0, 0, 1};
  std::vector<TensorView> tensors() const {
    return {{"w", "F32", {2, 3}, w.data()}, {"b", "F32", {3}, b.data()}, {"momentum:w", "F32", {2, 3}, mw.data()},
            {"momentum:b", "F32", {3}, mb.data()}};
  }
  far::Progress progress() const { return {7, 1, 2, 42, "feedbeef"}; }
};

void reads_back(const Fixture& fx) {
  far::write_state(fx.path, manifest(), fx.tensors(), fx.progress());
  const far::State s = far::read_state(fx.path, manifest());
  CHECK(s.step == 7 && s.epoch == 1 && s.batch == 2 && s.order_seed == 42 && s.examples_sha256 == "feedbeef");
  CHECK(s.tensor("w").shape == (std::vector<int64_t>{2, 3}) && s.tensor("w").at<float>(5) == 6.f);
  CHECK(s.slot("momentum", "b") != nullptr && s.slot("momentum", "b")->at<float>(2) == 1.f);
  CHECK(s.file.meta("content_sha256").size() == 64);
}

void refuses_damage(const Fixture& fx) {
  const std::string good = bytes_of(fx.path);
  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 0x01;  // a bit of the last tensor's data
  put_bytes(fx.path, flipped);
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "is damaged");
  put_bytes(fx.path, good.substr(0, good.size() - 4));
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "truncated");
  put_bytes(fx.path, good.substr(0, 5));
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "not even a header length");
  std::string huge = good;
  huge[6] = '\x7f';  // the header length's high bytes: far more than the file holds
  put_bytes(fx.path, huge);
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "the header claims");
  put_bytes(fx.path, "");
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "start again from the export's state.safetensors");
  CHECK_THROWS(StateError, far::read_state(fx.dir + "/absent.safetensors", manifest()), "cannot open");
}

void refuses_foreign(const Fixture& fx) {
  far::write_state(fx.path, manifest(), fx.tensors(), fx.progress());
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest("sgd", "base-2")), "another base model");
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest("sgd", "base-1", "other")), "another training program");
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest("sgd", "base-1", "abc123", 4)), "has shape [2, 3]");
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest("adamw")), "does not train with adamw");
  // A tensor the export does not train, and one it lacks.
  std::vector<TensorView> extra = fx.tensors();
  extra.push_back({"bogus", "F32", {3}, fx.b.data()});
  far::write_state(fx.path, manifest(), extra, fx.progress());
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "holds 'bogus'");
  std::vector<TensorView> missing = fx.tensors();
  missing.erase(missing.begin() + 1);
  far::write_state(fx.path, manifest(), missing, fx.progress());
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "has no tensor 'b'");
  std::vector<TensorView> wrong_dtype = fx.tensors();
  wrong_dtype[1] = {"b", "I32", {3}, fx.b.data()};
  far::write_state(fx.path, manifest(), wrong_dtype, fx.progress());
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "int32, the manifest says [3] float32");
}

void refuses_metadata(const Fixture& fx) {
  // Metadata sealed with a correct content_sha256, so only the check under test can refuse it.
  auto write_with = [&](std::map<std::string, std::string> meta) {
    meta["content_sha256"] = far::content_sha256(meta, fx.tensors());
    far::safetensors::write_atomic(fx.path, fx.tensors(), meta);
  };
  const std::map<std::string, std::string> good = {
      {"format", "far.device.state"}, {"format_version", "1"}, {"base_fingerprint", "base-1"},
      {"program_sha256", "abc123"},   {"step", "3"},           {"epoch", "0"},
      {"batch", "3"},                 {"order_seed", "5"},     {"examples_sha256", ""}};
  write_with(good);
  CHECK(far::read_state(fx.path, manifest()).step == 3);
  for (const char* key : {"step", "epoch", "batch", "order_seed"}) {
    // strtoll would read the last two as 2**63 - 1 and as 3: neither is a number far writes.
    for (const char* bad : {"-1", "3x", "", "99999999999999999999", " 3"}) {
      auto meta = good;
      meta[key] = bad;
      write_with(meta);
      CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), std::string(key) + "='" + bad + "' is not a whole");
    }
  }
  auto other_format = good;
  other_format["format_version"] = "2";
  write_with(other_format);
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "not a far.device training state of version 1");
}

// A header that repeats a key is refused: which of the two entries would be the tensor is not for a reader
// to guess.
void refuses_repeated_keys(const Fixture& fx) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  put_bytes(fx.path, bytes + header + std::string(8, '\0'));
  CHECK_THROWS(StateError, far::read_state(fx.path, manifest()), "appears twice");
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/far_test_state_XXXXXX";
  Fixture fx;
  fx.dir = ::mkdtemp(tmpl);
  fx.path = fx.dir + "/state.safetensors";
  reads_back(fx);
  refuses_damage(fx);
  refuses_foreign(fx);
  refuses_metadata(fx);
  refuses_repeated_keys(fx);
  std::remove(fx.path.c_str());
  std::remove((fx.path + ".tmp").c_str());
  ::rmdir(fx.dir.c_str());
  return far::test::finish("state");
}
