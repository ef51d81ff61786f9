// The readers under the state: SHA-256 against FIPS 180-4's examples, safetensors files that cover their data
// exactly (or are refused), JSON that nests too deep, and manifest.json's refusals.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "check.h"
#include "far/json.h"
#include "far/manifest.h"
#include "far/safetensors.h"
#include "far/sha256.h"

namespace {

namespace st = far::safetensors;

std::string sha(const std::string& text) {
  far::Sha256 h;
  h.update(text);
  return h.hexdigest();
}

void sha256_vectors(const std::string& dir) {
  CHECK(sha("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  far::Sha256 million;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(chunk);  // updates that straddle the 64-byte blocks
  CHECK(million.hexdigest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  const std::string path = dir + "/abc.txt";
  std::ofstream(path, std::ios::binary) << "abc";
  CHECK(far::file_sha256(path) == sha("abc"));
  std::remove(path.c_str());
  CHECK_THROWS(std::runtime_error, far::file_sha256(path), "cannot open");
}

// The digests above with the CPU's SHA instructions and without, and the two on 100 KB of bytes fed in uneven
// pieces (every length of update from 1 to 300, so whole blocks come straight from the buffer and from the
// pending block alike).
void sha256_both_ways(const std::string& dir) {
  const bool cpu = far::sha256_cpu_instructions(true);
  std::printf("sha256: this CPU's SHA instructions %s\n", cpu ? "used and checked" : "absent: portable code only");
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::string digests[2];
  for (bool on : {true, false}) {
    far::sha256_cpu_instructions(on);
    sha256_vectors(dir);
    far::Sha256 h;
    for (size_t at = 0, piece = 1; at < bytes.size(); at += piece, piece = piece % 300 + 1)
      h.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    digests[on] = h.hexdigest();
    CHECK(digests[on] == sha(bytes));
  }
  CHECK(digests[0] == digests[1]);
  far::sha256_cpu_instructions(true);
}

// A safetensors file of `header` and `data_len` zero bytes of data.
std::string with_header(const std::string& dir, const std::string& header, size_t data_len) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  const std::string path = dir + "/t.safetensors";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes << header << std::string(data_len, '\0');
  return path;
}

void safetensors_files(const std::string& dir) {
  const std::vector<float> a = {1.5f, -2.f, 3.25f};
  const std::vector<int64_t> b = {7, -8};
  const std::string path = dir + "/round.safetensors";
  st::write_atomic(path, {{"a", "F32", {3}, a.data()}, {"b", "I64", {1, 2}, b.data()}}, {{"k", "v \"quoted\"\n"}});
  const st::File f = st::read(path);
  CHECK(f.tensors.size() == 2 && f.find("a")->at<float>(2) == 3.25f && f.find("b")->at<int64_t>(1) == -8);
  CHECK(f.find("b")->shape == (std::vector<int64_t>{1, 2}) && f.meta("k") == "v \"quoted\"\n");
  std::remove(path.c_str());

  const std::string entry = R"({"dtype":"F32","shape":[2],"data_offsets":)";
  CHECK(st::read(with_header(dir, R"({"x":)" + entry + "[0,8]}}", 8)).find("x")->nbytes == 8);
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"x":)" + entry + "[0,8]}}", 4)), "truncated");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"x":)" + entry + "[0,8]}}", 12)), "after the last tensor");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"x":)" + entry + "[0,4]}}", 4)), "4 bytes for shape [2]");
  CHECK_THROWS(st::FormatError,
               st::read(with_header(dir, R"({"x":)" + entry + R"([0,8]},"y":)" + entry + "[4,12]}}", 12)),
               "overlap or leave a hole");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"x":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1)),
               "unknown dtype Q7");
  CHECK_THROWS(st::FormatError,
               st::read(with_header(dir, R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0)),
               "more bytes than any file");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0)),
               "bad shape");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"x":)" + entry + "[8,0]}}", 8)), "bad data_offsets");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"x":)" + entry + "[0,8]}", 8)), "corrupt header");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, R"({"__metadata__":{"a":1}})", 0)), "is not a string");
  CHECK_THROWS(st::FormatError, st::read(with_header(dir, "[1,2]", 0)), "not a JSON object");
  std::remove((dir + "/t.safetensors").c_str());
}

void json_limits() {
  CHECK_THROWS(std::runtime_error, far::parse_json(std::string(100, '[') + std::string(100, ']')), "nested deeper");
  CHECK(far::parse_json(std::string(30, '[') + std::string(30, ']')).is_array());
  CHECK_THROWS(std::runtime_error, far::parse_json(R"({"a":{"b":1,"b":2}})"), "\"b\" appears twice");
  CHECK(far::parse_json(R"({"a":{"b":1},"c":{"b":2}})")["c"]["b"] == 2);  // the same key in two objects is fine
  CHECK_THROWS(std::runtime_error, far::parse_json("{\"a\": tru}"), "malformed JSON");
}

far::Json good_manifest() {
  return {{"format", "far.device"},  {"format_version", 2}, {"batch_size", 8},  {"micro_batch_size", 4},
          {"accumulate", 2},         {"max_length", 16},    {"base_fingerprint", "f"},
          {"tokenizer", {{"pad_token_id", 3}}},
          {"trainable", {{{"name", "w"}, {"shape", {2, 3}}}}},
          {"programs", {{"train", {{"file", "train.pte"}, {"sha256", "s"}, {"inputs", {{{"name", "input_ids"}}}}}}}},
          {"optimizer", {{"name", "adamw"}, {"lr", 1e-3}, {"betas", {0.9, 0.99}}, {"eps", 1e-8}, {"max_grad_norm", 1.0},
                         {"schedule", {{"kind", "linear"}, {"warmup_steps", 2}, {"total_steps", nullptr}, {"offset", 1}}}}}};
}

void manifests() {
  const far::Manifest m = far::parse_manifest(good_manifest().dump(), "OUT");
  CHECK(m.batch_size == 4 && m.accumulate == 2 && m.max_length == 16 && m.pad_token_id == 3);
  CHECK(m.trainable.size() == 1 && m.trainable[0].shape == (std::vector<int64_t>{2, 3}));
  CHECK(m.inputs == std::vector<std::string>{"input_ids"} && m.path(m.train) == "OUT/train.pte" && !m.has_bottom());
  CHECK(m.optimizer.name == "adamw" && m.optimizer.beta2 == 0.99 && m.optimizer.max_grad_norm == 1.0);
  CHECK(m.optimizer.linear_schedule && m.optimizer.warmup_steps == 2 && m.optimizer.total_steps == 0);
  auto refused = [](const far::Json& j, const std::string& part) {
    CHECK_THROWS(std::runtime_error, far::parse_manifest(j.dump(), "OUT"), part);
  };
  far::Json j = good_manifest();
  j["format_version"] = 3;
  refused(j, "format_version 3; far_train reads version 2");
  j = good_manifest();
  j["batch_size"] = 6;
  refused(j, "batch_size is not micro_batch_size x accumulate");
  j = good_manifest();
  j.erase("max_length");
  refused(j, "missing \"max_length\"");
  j = good_manifest();
  j["optimizer"]["name"] = "lion";
  refused(j, "optimizer \"lion\" is not supported");
  j = good_manifest();
  j["optimizer"]["lr"] = "fast";
  refused(j, "\"optimizer\".\"lr\" is not a number");
  j = good_manifest();
  j["optimizer"]["betas"] = {0.9};
  refused(j, "betas\" must be two numbers");
  j = good_manifest();
  j["trainable"][0]["dtype"] = "bfloat16";
  refused(j, "trains float32 tensors only");
  j = good_manifest();
  j["programs"].erase("train");
  refused(j, "has no \"train\" program");
  j = good_manifest();
  j["programs"]["train"]["sha256"] = 5;
  refused(j, "needs \"file\" and \"sha256\"");
  CHECK_THROWS(std::runtime_error, far::read_manifest("/nonexistent/far"), "a folder written by `far export --executorch`");
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/far_test_formats_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  sha256_both_ways(dir);
  safetensors_files(dir);
  json_limits();
  manifests();
  ::rmdir(dir.c_str());
  return far::test::finish("formats");
}
