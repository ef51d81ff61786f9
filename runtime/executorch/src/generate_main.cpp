// far_generate: greedy generation with a causal LM export's generate.pte and a training state, without Python.
//
//   far_generate OUT --state STATE --prompt-ids 1,2,3 [--max-new-tokens N] [--threads T]
//
// Prints "ids=..." (the written token ids, comma-separated), then "text:" and their text on the lines after;
// the plan and timings go to stderr. Exit status: 0 done; 2 refused before generating (bad arguments, manifest,
// program, state or prompt; see far/generator.h); 1 failed while generating (an ExecuTorch error).
#include <executorch/runtime/platform/runtime.h>

#include <cstdio>
#include <memory>

#include "far/args.h"
#include "far/generator.h"

int main(int argc, char** argv) {
  std::unique_ptr<far::Generator> generator;
  far::GenerateArgs args;
  try {
    args = far::parse_generate_args(argc, argv);
    if (args.help) {
      std::fputs(far::kGenerateUsage, stdout);
      return 0;
    }
    executorch::runtime::runtime_init();
    generator = std::make_unique<far::Generator>(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "far_generate: refused: %s\n", e.what());
    std::fputs("(nothing was generated; see far_generate --help)\n", stderr);
    return 2;
  }
  try {
    const far::Generation g = generator->run();
    const size_t n = g.ids.size();
    std::fprintf(stderr, "far_generate: planned %.1f MB; prompt %zu tokens in %.3f s; %zu tokens written in %.3f s "
                 "(%.2f tokens/s)\n", generator->planned_bytes() / 1e6, args.prompt_ids.size(), g.prefill_s, n,
                 g.decode_s, g.decode_s > 0 ? n / g.decode_s : 0.0);
    std::printf("ids=");
    for (size_t i = 0; i < n; ++i) std::printf(i ? ",%lld" : "%lld", static_cast<long long>(g.ids[i]));
    std::printf("\ntext:\n%s\n", generator->decode(g.ids).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "far_generate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
