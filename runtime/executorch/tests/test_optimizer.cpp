// far::optim (clipping, the schedule, SGD with momentum and AdamW) against far/device/optim.py's numbers
// (tests/data/reference.json): every parameter after every step, and the slots at the end.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "far/manifest.h"
#include "far/optimizer.h"
#include "reference.h"

namespace {

// The optimizer's settings as far_train reads them: through a manifest that holds them.
far::OptimizerSettings settings_of(const far::Json& python_settings) {
  const far::Json manifest = {
      {"format", "far.device"},          {"format_version", 2}, {"batch_size", 4}, {"micro_batch_size", 4},
      {"accumulate", 1},                 {"max_length", 8},     {"base_fingerprint", "f"},
      {"trainable", {"encoder.weight"}}, {"programs", {{"train", {{"file", "train.pte"}, {"sha256", "0"}}}}},
      {"optimizer", python_settings}};
  return far::parse_manifest(manifest.dump(), ".").optimizer;
}

double worst = 0;  // the largest relative difference seen, reported at the end

bool close(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, diff / std::max(1e-30, std::fabs(static_cast<double>(want[i]))));
    if (diff > 1e-6 * std::fabs(want[i]) + 1e-7) return false;
  }
  return true;
}

void run_case(const std::string& name, const far::Json& c, const std::vector<std::string>& tensors) {
  const far::OptimizerSettings o = settings_of(c["settings"]);
  const std::vector<std::string> slot_names = far::optim::slots(o);
  std::map<std::string, std::vector<float>> params;
  std::map<std::string, std::vector<std::vector<float>>> slots;
  for (const auto& t : tensors) {
    params[t] = far::test::floats(c["initial"][t]);
    slots[t].assign(slot_names.size(), std::vector<float>(params[t].size()));
  }
  const int64_t run_steps = static_cast<int64_t>(c["steps"].size());
  for (int64_t step = 0; step < run_steps; ++step) {
    const far::Json& s = c["steps"][step];
    std::map<std::string, std::vector<float>> grads;
    std::vector<std::pair<const float*, int64_t>> views;
    for (const auto& t : tensors) {
      grads[t] = far::test::floats(s["grads"][t]);
      views.emplace_back(grads[t].data(), static_cast<int64_t>(grads[t].size()));
    }
    if (o.max_grad_norm > 0) {
      const float factor = far::optim::clip_factor(views, o.max_grad_norm);
      for (auto& [t, g] : grads)
        for (float& v : g) v *= factor;
    }
    const double lr = far::optim::lr_at(o, step, run_steps);
    CHECK(std::fabs(lr - s["lr"].get<double>()) <= 1e-15 * std::fabs(lr) + 1e-18);
    for (const auto& t : tensors) {
      std::vector<float*> state;
      for (auto& v : slots[t]) state.push_back(v.data());
      far::optim::update(o, lr, step + 1, params[t].data(), grads[t].data(), state, step == 0,
                         static_cast<int64_t>(params[t].size()));
      const bool ok = close(params[t], far::test::floats(s["params"][t]));
      if (!ok) std::fprintf(stderr, "%s: '%s' after step %lld\n", name.c_str(), t.c_str(), (long long)step + 1);
      CHECK(ok);
    }
  }
  for (size_t k = 0; k < slot_names.size(); ++k)
    for (const auto& t : tensors) CHECK(close(slots[t][k], far::test::floats(c["slots"][slot_names[k]][t])));
  CHECK(c["slots"].size() == slot_names.size());
}

}  // namespace

int main(int argc, char** argv) {
  const far::Json ref = far::test::load_reference(argc > 1 ? argv[1] : "tests/data");
  std::vector<std::string> tensors;
  for (const auto& [name, shape] : ref["shapes"].items()) tensors.push_back(name);
  for (const auto& [name, c] : ref["optimizers"].items()) run_case(name, c, tensors);
  CHECK(ref["optimizers"].size() == 4);
  std::printf("optimizer: largest relative difference from far/device/optim.py: %.3g\n", worst);
  return far::test::finish("optimizer");
}
