// The kernels a training step's products and copies run on, ahead of the wheel's.
//
// The executorch wheel's optimized `linear`, `mm` and `bmm` multiply float32 at about 40% of what this CPU does
// with torch (docs/device.md, Runner step), and its portable `permute_copy` moves one element at a time. These
// kernels do the same operations with XNNPACK's GEMM and transpose microkernels (the wheel's XNNPACK backend
// library exports them), packing each weight block as it is used: a training step's weights change every step,
// so there is nothing to pack once and keep, and a block at a time bounds the extra memory to kPackBytes.
//
// Each kernel takes only the case it is written for (float32, contiguous, enough rows to be worth packing) and
// hands every other call, unchanged, to the wheel's kernel for the same operator: same results up to the order of
// a sum's terms, for any program. Program::load_forward loads methods with them (a method-scoped registry).
#pragma once

#include <executorch/runtime/kernel/operator_registry.h>

#include <cstddef>
#include <cstdint>

namespace far {

// The largest weight block packed at once (bytes of float32 values).
constexpr size_t kPackBytes = size_t{4} << 20;

// The wheel's registry with these kernels in place of its own for their operators; empty (the wheel's kernels
// for everything) when the environment sets FAR_KERNELS=wheel (the benchmark compares the two in one build) or
// XNNPACK does not initialize on this CPU.
executorch::runtime::Span<const executorch::runtime::Kernel> step_kernels();

// Calls these kernels computed themselves, and calls they handed to the wheel's, since the process started.
struct KernelCalls {
  uint64_t own = 0, handed = 0;
};
KernelCalls kernel_calls();

}  // namespace far
