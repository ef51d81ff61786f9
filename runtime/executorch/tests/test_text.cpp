// A causal LM's text on the runner: the chunks reader takes what far/device/lm_text.py writes and refuses,
// before training, a file of another export (base, length, vocabulary) or a damaged one; the bottom cache is
// computed once, mapped back, reused for the same key, and rebuilt for another key or a damaged file; the
// manifest reads a next_token export's fields and refuses an unknown objective.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "far/chunks.h"
#include "far/json.h"
#include "far/manifest.h"

namespace {

using far::safetensors::TensorView;
using Meta = std::map<std::string, std::string>;

const Meta kMeta = {{"format", "far.device.chunks"}, {"format_version", "1"}, {"base_fingerprint", "base-1"},
                    {"max_length", "4"}, {"vocab_size", "10"}};

void write_chunks(const std::string& path, const Meta& meta, const std::vector<int32_t>& train,
                  const std::vector<int32_t>& held, int64_t length = 4, const std::string& dtype = "I32") {
  const int64_t width = dtype == "I32" ? 1 : 2;  // I64: the same bytes read as half as many ids
  far::safetensors::write_atomic(path,
                                 {{"train", dtype, {static_cast<int64_t>(train.size()) / length / width, length},
                                   train.data()},
                                  {"held_out", "I32", {static_cast<int64_t>(held.size()) / length, length}, held.data()}},
                                 meta);
}

void reads_and_refuses(const std::string& dir) {
  const std::string path = dir + "/text.safetensors";
  const std::vector<int32_t> train = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2}, held = {3, 4, 5, 6};
  write_chunks(path, kMeta, train, held);
  const auto c = far::read_chunks(path, 4, 10, "base-1");
  CHECK(c->n_train == 3 && c->n_held_out == 1 && c->length == 4);
  CHECK(c->id(0, 0) == 1 && c->id(2, 3) == 2 && c->id(3, 0) == 3 && c->id(3, 3) == 6);  // held-out rows follow

  using E = std::runtime_error;
  CHECK_THROWS(E, far::read_chunks(path, 4, 10, "base-2"), "written for another base model");
  CHECK_THROWS(E, far::read_chunks(path, 8, 10, "base-1"), "chunks of 4 tokens; the program takes 8");
  CHECK_THROWS(E, far::read_chunks(path, 4, 9, "base-1"), "token id 9, outside the model's vocabulary (0-8)");
  Meta other = kMeta;
  other["format"] = "far.device.examples";
  write_chunks(path, other, train, held);
  CHECK_THROWS(E, far::read_chunks(path, 4, 10, "base-1"), "not a chunks file");
  other = kMeta;
  other["format_version"] = "2";
  write_chunks(path, other, train, held);
  CHECK_THROWS(E, far::read_chunks(path, 4, 10, "base-1"), "far_train reads version 1");
  write_chunks(path, kMeta, {1, 2, 3, -1}, held);
  CHECK_THROWS(E, far::read_chunks(path, 4, 10, "base-1"), "token id -1");
  write_chunks(path, kMeta, {1, 2, 3, 4, 5, 6, 7, 8}, held, 4, "I64");
  CHECK_THROWS(E, far::read_chunks(path, 4, 10, "base-1"), "'train' is I64, not int32");
  write_chunks(path, kMeta, {1, 2, 3, 4, 5, 6}, {1, 2, 3}, 3);
  CHECK_THROWS(E, far::read_chunks(path, 4, 10, "base-1"), "has shape [2, 3], not [N, 4]");
  far::safetensors::write_atomic(path, {{"train", "I32", {1, 4}, train.data()}}, kMeta);
  CHECK_THROWS(E, far::read_chunks(path, 4, 10, "base-1"), "lacks 'held_out'");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a file";
  CHECK_THROWS(far::safetensors::FormatError, far::read_chunks(path, 4, 10, "base-1"), path);
  std::remove(path.c_str());
}

void caches_the_bottom(const std::string& dir) {
  const std::string path = dir + "/state.safetensors.bottom";
  int calls = 0;
  // Row r's output is r + j / 10 at position j: batches of 2 over 5 rows, the last one padded.
  auto compute = [&](int64_t first, float* out) {
    ++calls;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t j = 0; j < 3 * 2; ++j) out[r * 6 + j] = static_cast<float>(first + r) + j / 10.f;
  };
  const Meta key = {{"bottom_sha256", "b1"}, {"chunks_sha256", "c1"}};
  {
    const far::BottomCache cache(path, key, 5, 3, 2, 2, compute);
    CHECK(cache.built() && calls == 3 && cache.row_floats() == 6);
    CHECK(cache.row(0)[0] == 0.f && cache.row(4)[5] == 4.5f && cache.row(3)[1] == 3.1f);
  }
  CHECK(::access((path + ".tmp").c_str(), F_OK) != 0);
  {
    const far::BottomCache again(path, key, 5, 3, 2, 2, compute);
    CHECK(!again.built() && calls == 3 && again.row(4)[5] == 4.5f);  // reused: nothing computed
  }
  const Meta other = {{"bottom_sha256", "b1"}, {"chunks_sha256", "c2"}};
  const far::BottomCache rebuilt(path, other, 5, 3, 2, 2, compute);
  CHECK(rebuilt.built() && calls == 6);
  const far::BottomCache reshaped(path, other, 4, 3, 2, 2, compute);  // another row count: built again
  CHECK(reshaped.built() && calls == 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "damaged";
  const far::BottomCache repaired(path, other, 4, 3, 2, 2, compute);
  CHECK(repaired.built() && repaired.row(3)[5] == 3.5f);
  std::remove(path.c_str());
}

void reads_a_next_token_manifest() {
  far::Json m = {{"format", "far.device"}, {"format_version", 2}, {"batch_size", 2}, {"micro_batch_size", 1},
                 {"accumulate", 2}, {"max_length", 16}, {"base_fingerprint", "base-1"}, {"objective", "next_token"},
                 {"vocab_size", 97}, {"hidden_size", 32},
                 {"trainable", {{{"name", "norm.stored"}, {"shape", {32}}, {"dtype", "float32"}}}},
                 {"programs", {{"train", {{"file", "train.pte"}, {"sha256", "x"}}}}},
                 {"optimizer", {{"name", "adamw"}, {"lr", 0.01}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}}}};
  const far::Manifest read = far::parse_manifest(m.dump(), "OUT");
  CHECK(read.next_token && read.vocab_size == 97 && read.hidden_size == 32);
  using E = std::runtime_error;
  far::Json bad = m;
  bad["objective"] = "masked_lm";
  CHECK_THROWS(E, far::parse_manifest(bad.dump(), "OUT"), "is not one far_train trains");
  bad = m;
  bad.erase("vocab_size");
  CHECK_THROWS(E, far::parse_manifest(bad.dump(), "OUT"), "missing \"vocab_size\"");
  bad = m;
  bad["hidden_size"] = 0;
  CHECK_THROWS(E, far::parse_manifest(bad.dump(), "OUT"), "must be positive");
  bad = m;
  bad.erase("objective");
  CHECK(!far::parse_manifest(bad.dump(), "OUT").next_token);  // a classifier's manifest has none
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/far_test_text_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  reads_and_refuses(dir);
  caches_the_bottom(dir);
  reads_a_next_token_manifest();
  ::rmdir(dir.c_str());
  return far::test::finish("text");
}
