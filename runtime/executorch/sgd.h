// torch.optim.SGD's step for one float32 tensor (the single-tensor path torch takes on CPU), so that a run on
// the device and the same run in torch agree to rounding:
//   d = g + weight_decay * p
//   buf = d (first step) | buf = momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf
//   p = p - lr * d
// All arithmetic is in float, like torch's kernels on float tensors (its Python scalars become floats).
#pragma once

#include <cstdint>

#include "manifest.h"

namespace far_sgd {

// `buf` is the momentum buffer (unused when momentum is 0); `first` says it holds nothing yet.
inline void step(const far_manifest::Optimizer& o, float* p, const float* g, float* buf, bool first, int64_t n) {
  const float lr = static_cast<float>(o.lr), wd = static_cast<float>(o.weight_decay);
  const float mom = static_cast<float>(o.momentum), keep = static_cast<float>(1.0 - o.dampening);
  for (int64_t i = 0; i < n; ++i) {
    float d = wd != 0.f ? g[i] + wd * p[i] : g[i];
    if (mom != 0.f) {
      buf[i] = first ? d : buf[i] * mom + keep * d;
      d = o.nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] = p[i] + (-lr) * d;
  }
}

}  // namespace far_sgd
