// far_train: train an exported FAR program on the device, without Python.
//
//   far_train OUT --examples FILE --state STATE --epochs N [--max-steps M] [--checkpoint-every S]
//             [--out STATE_OUT] [--resume] [--seed K] [--threads T]
//
// Exit status: 0 done; 2 refused before training (bad arguments, state, examples, manifest or program);
// 1 failed while training (an ExecuTorch error, a non-finite loss). Either way STATE_OUT keeps its last
// complete version. What a run does is far/trainer.h's.
#include <executorch/runtime/platform/runtime.h>

#include <cstdio>
#include <memory>

#include "far/args.h"
#include "far/trainer.h"

int main(int argc, char** argv) {
  std::unique_ptr<far::Trainer> trainer;
  try {
    const far::Args args = far::parse_args(argc, argv);
    if (args.help) {
      std::fputs(far::kUsage, stdout);
      return 0;
    }
    executorch::runtime::runtime_init();
    trainer = std::make_unique<far::Trainer>(args);
  } catch (const std::exception& e) {  // a Refusal, or a bad file found before training (format, manifest, program)
    std::fprintf(stderr, "far_train: refused: %s\n", e.what());
    std::fputs("(nothing was trained; see far_train --help)\n", stderr);
    return 2;
  }
  try {
    trainer->train();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "far_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
