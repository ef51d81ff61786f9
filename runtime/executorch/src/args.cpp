#include "far/args.h"

#include <cstdlib>

namespace far {

const char* const kUsage =
    "usage: far_train OUT --examples FILE --state STATE --epochs N [--max-steps M] [--checkpoint-every S]\n"
    "                 [--out STATE_OUT] [--resume] [--seed K] [--threads T] [--bottom-cache FILE]\n"
    "  OUT                 folder written by `far export --executorch OUT` (train.pte, [bottom.pte], manifest.json)\n"
    "  --examples FILE     safetensors: input_ids, attention_mask, [token_type_ids] int64 [N, L]; labels [N];\n"
    "                      for a causal LM's export, its chunks of text (OUT/text.safetensors)\n"
    "  --state STATE       the training state (OUT/state.safetensors, or a checkpoint of this export)\n"
    "  --epochs N          train until N epochs are done in all (a resumed state counts its steps)\n"
    "  --max-steps M       stop at M steps in all, if N epochs make more (0: no limit, the default)\n"
    "  --checkpoint-every S  write STATE_OUT every S steps (atomically); 0: only at the end (default)\n"
    "  --out STATE_OUT     where checkpoints and the final state go (default: STATE, updated in place)\n"
    "  --resume            start from STATE_OUT if it exists (after a kill), else from STATE\n"
    "  --seed K            the order of the examples, for a state at step 0 (default: its order_seed)\n"
    "  --threads T         ExecuTorch threadpool size (default: its own choice, the performant cores)\n"
    "  --bottom-cache FILE  a causal LM's frozen bottom output per chunk, computed once and reused\n"
    "                      (default: STATE_OUT.bottom)\n";

int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || v < lo)
    throw Refusal(flag + " takes an integer >= " + std::to_string(lo) + ", not '" + text + "'");
  return v;
}

Args parse_args(int argc, const char* const* argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw Refusal(f + " needs a value");
      return argv[++i];
    };
    if (f == "--examples") a.examples = value();
    else if (f == "--state") a.state = value();
    else if (f == "--out") a.state_out = value();
    else if (f == "--bottom-cache") a.bottom_cache = value();
    else if (f == "--epochs") a.epochs = parse_int(f, value(), 0);
    else if (f == "--max-steps") a.max_steps = parse_int(f, value(), 0);
    else if (f == "--checkpoint-every") a.checkpoint_every = parse_int(f, value(), 0);
    else if (f == "--threads") a.threads = parse_int(f, value(), 1);
    else if (f == "--seed") { a.seed = static_cast<uint64_t>(parse_int(f, value(), 0)); a.seed_given = true; }
    else if (f == "--resume") a.resume = true;
    else if (f == "-h" || f == "--help") { a.help = true; return a; }
    else if (!f.empty() && f[0] == '-') throw Refusal("unknown option " + f);
    else if (a.out_dir.empty()) a.out_dir = f;
    else throw Refusal("unexpected argument " + f);
  }
  if (a.out_dir.empty() || a.examples.empty() || a.state.empty() || a.epochs < 0)
    throw Refusal("OUT, --examples, --state and --epochs are required");
  if (a.state_out.empty()) a.state_out = a.state;
  if (a.bottom_cache.empty()) a.bottom_cache = a.state_out + ".bottom";
  return a;
}

}  // namespace far
