#include "far/optimizer.h"

#include <algorithm>
#include <cmath>

namespace far::optim {

std::vector<std::string> slots(const OptimizerSettings& o) {
  if (o.name == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (o.momentum != 0) return {"momentum"};
  return {};
}

double lr_at(const OptimizerSettings& o, int64_t step, int64_t run_steps) {
  if (!o.linear_schedule) return o.lr;
  const int64_t total = o.total_steps > 0 ? o.total_steps : o.offset + run_steps;
  const int64_t at = o.offset + step;
  if (at < o.warmup_steps) return o.lr * (static_cast<double>(at) / std::max<int64_t>(1, o.warmup_steps));
  return o.lr * std::max(0.0, static_cast<double>(total - at) / std::max<int64_t>(1, total - o.warmup_steps));
}

float clip_factor(const std::vector<std::pair<const float*, int64_t>>& grads, double max_norm) {
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

namespace {

void adamw(const OptimizerSettings& o, double lr, int64_t t, float* p, const float* g, float* m, float* v, bool first,
           int64_t n) {
  const float decay = static_cast<float>(1.0 - lr * o.weight_decay);
  const float w = static_cast<float>(1.0 - o.beta1), b2 = static_cast<float>(o.beta2),
              one_minus_b2 = static_cast<float>(1.0 - o.beta2);
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(t))));
  const float neg_step = static_cast<float>(-(lr / (1.0 - std::pow(o.beta1, static_cast<double>(t)))));
  const float eps = static_cast<float>(o.eps);
  for (int64_t i = 0; i < n; ++i) {
    if (first) m[i] = v[i] = 0.f;
    p[i] = p[i] * decay;
    m[i] = w < 0.5f ? m[i] + w * (g[i] - m[i]) : g[i] - (g[i] - m[i]) * (1.f - w);  // torch's lerp
    v[i] = v[i] * b2 + one_minus_b2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] + neg_step * m[i] / denom;
  }
}

void sgd(const OptimizerSettings& o, double lr, float* p, const float* g, float* buf, bool first, int64_t n) {
  const float lr_f = static_cast<float>(lr), wd = static_cast<float>(o.weight_decay);
  const float mom = static_cast<float>(o.momentum), keep = static_cast<float>(1.0 - o.dampening);
  for (int64_t i = 0; i < n; ++i) {
    float d = wd != 0.f ? g[i] + wd * p[i] : g[i];
    if (mom != 0.f) {
      buf[i] = first ? d : buf[i] * mom + keep * d;
      d = o.nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] = p[i] + (-lr_f) * d;
  }
}

}  // namespace

void update(const OptimizerSettings& o, double lr, int64_t t, float* p, const float* g, const std::vector<float*>& state,
            bool first, int64_t n) {
  if (o.name == "adamw") adamw(o, lr, t, p, g, state.at(0), state.at(1), first, n);
  else sgd(o, lr, p, g, state.empty() ? nullptr : state[0], first, n);
}

}  // namespace far::optim
