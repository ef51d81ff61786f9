// The device's optimizers, as far/device/optim.py writes them out (torch's single-tensor updates on CPU, in
// float like torch's kernels on float tensors, their Python scalars computed in double first), so that a run
// here and the same run in torch agree to rounding:
//   sgd:   d = g + weight_decay * p; buf = d (first step) | momentum * buf + (1 - dampening) * d;
//          d = nesterov ? d + momentum * buf : buf; p -= lr * d                       (slot "momentum")
//   adamw: p *= 1 - lr * weight_decay; m = lerp(m, g, 1 - beta1); v = beta2 * v + (1 - beta2) * g * g;
//          p += -(lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)   (slots "exp_avg", "exp_avg_sq")
// with t the step's number from 1. Before the update the gradients' total L2 norm is clipped to
// max_grad_norm (torch.nn.utils.clip_grad_norm_), and lr follows the schedule (far's WarmupLinear).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "manifest.h"

namespace far_optim {

// The state slots an optimizer keeps per trainable tensor, as the state file names them ("<slot>:<name>").
inline std::vector<std::string> slots(const far_manifest::Optimizer& o) {
  if (o.name == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (o.momentum != 0) return {"momentum"};
  return {};
}

// The learning rate of the update from `step` to `step + 1` in a run of `run_steps` steps.
inline double lr_at(const far_manifest::Optimizer& o, int64_t step, int64_t run_steps) {
  if (!o.linear_schedule) return o.lr;
  const int64_t total = o.total_steps > 0 ? o.total_steps : o.offset + run_steps;
  const int64_t at = o.offset + step;
  if (at < o.warmup_steps) return o.lr * (static_cast<double>(at) / std::max<int64_t>(1, o.warmup_steps));
  return o.lr * std::max(0.0, static_cast<double>(total - at) / std::max<int64_t>(1, total - o.warmup_steps));
}

// torch.nn.utils.clip_grad_norm_ over all gradients: the factor to scale them by (1 when within the norm).
inline float clip_factor(const std::vector<std::pair<float*, int64_t>>& grads, double max_norm) {
  double total_sq = 0;
  for (const auto& [g, n] : grads) {
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(g[i]) * g[i];
    const float norm = static_cast<float>(std::sqrt(sq));  // each tensor's norm, in float as torch returns it
    total_sq += static_cast<double>(norm) * norm;
  }
  const float total = static_cast<float>(std::sqrt(total_sq));
  return std::min(1.0f, static_cast<float>(max_norm) / (total + 1e-6f));
}

// One update of one float32 tensor. `state` holds its slots (slots(o) order); `first`: they hold nothing yet.
inline void step(const far_manifest::Optimizer& o, double lr, int64_t t, float* p, const float* g,
                 std::vector<float*>& state, bool first, int64_t n) {
  if (o.name == "adamw") {
    const float decay = static_cast<float>(1.0 - lr * o.weight_decay);
    const float w = static_cast<float>(1.0 - o.beta1), b2 = static_cast<float>(o.beta2),
                one_minus_b2 = static_cast<float>(1.0 - o.beta2);
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(t))));
    const float neg_step = static_cast<float>(-(lr / (1.0 - std::pow(o.beta1, static_cast<double>(t)))));
    const float eps = static_cast<float>(o.eps);
    float *m = state[0], *v = state[1];
    for (int64_t i = 0; i < n; ++i) {
      if (first) m[i] = v[i] = 0.f;
      p[i] = p[i] * decay;
      m[i] = w < 0.5f ? m[i] + w * (g[i] - m[i]) : g[i] - (g[i] - m[i]) * (1.f - w);  // torch's lerp
      v[i] = v[i] * b2 + one_minus_b2 * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] = p[i] + neg_step * m[i] / denom;
    }
    return;
  }
  const float lr_f = static_cast<float>(lr), wd = static_cast<float>(o.weight_decay);
  const float mom = static_cast<float>(o.momentum), keep = static_cast<float>(1.0 - o.dampening);
  float* buf = state.empty() ? nullptr : state[0];
  for (int64_t i = 0; i < n; ++i) {
    float d = wd != 0.f ? g[i] + wd * p[i] : g[i];
    if (mom != 0.f) {
      buf[i] = first ? d : buf[i] * mom + keep * d;
      d = o.nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] = p[i] + (-lr_f) * d;
  }
}

}  // namespace far_optim
