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

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "far/manifest.h"

namespace far::optim {

// The state slots an optimizer keeps per trainable tensor, as the state file names them ("<slot>:<name>").
std::vector<std::string> slots(const OptimizerSettings& o);

// The learning rate of the update from `step` to `step + 1` in a run of `run_steps` steps.
double lr_at(const OptimizerSettings& o, int64_t step, int64_t run_steps);

// torch.nn.utils.clip_grad_norm_ over all gradients: the factor to scale them by (1 when within the norm).
float clip_factor(const std::vector<std::pair<const float*, int64_t>>& grads, double max_norm);

// One update of one float32 tensor of `n` values at learning rate `lr`, `t` the step's number from 1.
// `state` holds its slots (slots(o) order); `first`: they hold nothing yet.
void update(const OptimizerSettings& o, double lr, int64_t t, float* p, const float* g, const std::vector<float*>& state,
            bool first, int64_t n);

}  // namespace far::optim
