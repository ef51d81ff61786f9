#include "far/generator.h"

#include <chrono>
#include <cstdlib>

#include "far/args.h"

namespace far {

using executorch::aten::ScalarType;
using executorch::runtime::EValue;

const char* const kGenerateUsage =
    "usage: far_generate OUT --state STATE --prompt-ids IDS [--max-new-tokens N] [--threads T]\n"
    "  OUT                 a causal LM's export with generate.pte (far export --model NAME --executorch OUT --generate)\n"
    "  --state STATE       its training state: OUT/state.safetensors, or far_train's (what the user trained)\n"
    "  --prompt-ids IDS    the prompt's token ids, comma-separated (the export's tokenizer.json encodes text:\n"
    "                      python -c \"import tokenizers as t; print(*t.Tokenizer.from_file('OUT/tokenizer.json')\n"
    "                      .encode('Once upon a time').ids, sep=',')\")\n"
    "  --max-new-tokens N  tokens to write at most (default 32; fewer when the end-of-text token comes first)\n"
    "  --threads T         ExecuTorch threadpool size (default: its own choice)\n"
    "Prints the written ids (ids=...), then text: and their text; timings go to stderr.\n";

GenerateArgs parse_generate_args(int argc, const char* const* argv) {
  GenerateArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Refusal(f + " needs a value");
      return argv[++i];
    };
    if (f == "--state") a.state = value();
    else if (f == "--max-new-tokens") a.max_new_tokens = parse_int(f, value(), 1);
    else if (f == "--threads") a.threads = parse_int(f, value(), 1);
    else if (f == "--prompt-ids") {
      const std::string ids = value();
      size_t start = 0;
      while (start <= ids.size()) {
        const size_t comma = ids.find(',', start);
        a.prompt_ids.push_back(parse_int(f, ids.substr(start, comma - start), 0));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (f == "-h" || f == "--help") {
      a.help = true;
      return a;
    } else if (!f.empty() && f[0] == '-') throw Refusal("unknown option " + f);
    else if (a.out_dir.empty()) a.out_dir = f;
    else throw Refusal("unexpected argument " + f);
  }
  if (a.out_dir.empty() || a.state.empty() || a.prompt_ids.empty())
    throw Refusal("OUT, --state and --prompt-ids are required");
  return a;
}

Generator::Generator(const GenerateArgs& args) : args_(args), manifest_(read_manifest(args.out_dir)) {
  const std::string how = "export it with far export --model NAME --executorch OUT --generate";
  if (!manifest_.next_token) throw Refusal(args_.out_dir + " is not a causal LM's export; " + how);
  if (manifest_.generate.file.empty() || manifest_.cache_length <= 0)
    throw Refusal(args_.out_dir + " has no generate program (generate.pte); " + how);
  manifest_.check_program(manifest_.generate);
  state_ = read_state(args_.state, manifest_);  // another export's or base model's state is refused here
  for (int64_t id : args_.prompt_ids)
    if (id >= manifest_.vocab_size)
      throw Refusal("--prompt-ids: " + std::to_string(id) + " is not a token id of this vocabulary of " +
                    std::to_string(manifest_.vocab_size));
  const int64_t needed = static_cast<int64_t>(args_.prompt_ids.size()) + args_.max_new_tokens - 1;
  if (needed > manifest_.cache_length)
    throw Refusal(std::to_string(args_.prompt_ids.size()) + " prompt tokens and " + std::to_string(args_.max_new_tokens) +
                  " new ones need " + std::to_string(needed) + " positions; generate.pte keeps " +
                  std::to_string(manifest_.cache_length) +
                  ": shorten them, or export with a longer cache (far export --generate N)");
  tokenizer_ = std::make_unique<Tokenizer>(read_tokenizer(args_.out_dir + "/tokenizer.json"));
  if (args_.threads > 0) set_threads(static_cast<uint32_t>(args_.threads));
  program_ = std::make_unique<Program>(manifest_.path(manifest_.generate));
  fwd_ = &program_->load_forward();
  bind_trained();
}

// The state's tensors, in place, as the program's trained inputs (checked against its own input shapes).
void Generator::bind_trained() {
  using executorch::extension::make_tensor_ptr;
  const auto meta = program_->forward_meta();
  const size_t n = manifest_.trainable.size();
  if (meta.num_inputs() != 2 + n)
    throw Refusal(program_->path() + " takes " + std::to_string(meta.num_inputs()) + " inputs, not token, position " +
                  "and the manifest's " + std::to_string(n) + " trained tensors; export the folder again");
  for (size_t i = 0; i < n; ++i) {
    const safetensors::Tensor& t = state_.tensor(manifest_.trainable[i].name);
    const auto info = meta.input_tensor_meta(2 + i).get();
    std::vector<int64_t> sizes(info.sizes().begin(), info.sizes().end());
    if (sizes != t.shape || info.scalar_type() != ScalarType::Float)
      throw Refusal(program_->path() + " takes '" + t.name + "' as " + safetensors::shape_str(sizes) + ", the state holds " +
                    safetensors::shape_str(t.shape));
    std::vector<executorch::aten::SizesType> dims(t.shape.begin(), t.shape.end());
    // The program reads its inputs and never writes them: the state's mapped (read-only) bytes serve as they are.
    trained_.push_back(make_tensor_ptr(dims, const_cast<uint8_t*>(t.data), ScalarType::Float));
  }
  token_in_ = make_tensor_ptr({1, 1}, &token_, ScalarType::Long);
  position_in_ = make_tensor_ptr({1}, &position_, ScalarType::Long);
  const auto out = meta.output_tensor_meta(0).get();
  if (out.sizes().size() != 2 || out.sizes()[1] != manifest_.vocab_size)
    throw Refusal(program_->path() + " does not return logits over the vocabulary of " +
                  std::to_string(manifest_.vocab_size) + "; export the folder again");
}

const float* Generator::step(int64_t token, int64_t position) {
  token_ = token;
  position_ = position;
  executorch::runtime::Method& m = *fwd_;
  const EValue inputs[2] = {EValue(*token_in_), EValue(*position_in_)};
  for (size_t i = 0; i < 2 + trained_.size(); ++i) {
    const auto e = m.set_input(i < 2 ? inputs[i] : EValue(*trained_[i - 2]), i);
    if (e != executorch::runtime::Error::Ok)
      throw std::runtime_error("cannot set input " + std::to_string(i) + " of generate.pte (ExecuTorch error " +
                               error_name(e) + ")");
  }
  program_->execute();
  return m.get_output(0).toTensor().const_data_ptr<float>();
}

Generation Generator::run() {
  Generation g;
  const auto& prompt = args_.prompt_ids;
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t position = 0; position < n_prompt + args_.max_new_tokens - 1; ++position) {
    const int64_t token = position < n_prompt ? prompt[position] : g.ids.back();
    if (position == n_prompt - 1) {  // the prompt is read but for its last token, which writes the first
      const auto now = std::chrono::steady_clock::now();
      g.prefill_s = std::chrono::duration<double>(now - t0).count();
      t0 = now;
    }
    const float* logits = step(token, position);
    if (position < n_prompt - 1) continue;
    int64_t best = 0;
    for (int64_t v = 1; v < manifest_.vocab_size; ++v)
      if (logits[v] > logits[best]) best = v;
    g.ids.push_back(best);
    if (best == manifest_.eos_token_id) break;
  }
  g.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

}  // namespace far
