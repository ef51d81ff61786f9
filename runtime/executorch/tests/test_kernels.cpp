// far's step kernels (src/kernels.cpp) against the executorch wheel's kernels for the same operators, on the same
// seeded inputs: the shapes a training step gives them (weights packed in one block and in several, reductions
// split across blocks), and the cases they hand to the wheel's (one row, other dtypes), which must then match
// exactly.
#include "check.h"
#include "far/kernels.h"

#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/platform/runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace et = executorch::runtime;
using executorch::aten::BFloat16;
using executorch::aten::SizesType;
using executorch::extension::make_tensor_ptr;
using executorch::extension::TensorPtr;

namespace {

std::mt19937 rng(7);

TensorPtr random(const std::vector<SizesType>& sizes) {
  size_t n = 1;
  for (auto s : sizes) n *= s;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return make_tensor_ptr(sizes, std::move(v));
}

TensorPtr zeros(const std::vector<SizesType>& sizes) {
  size_t n = 1;
  for (auto s : sizes) n *= s;
  return make_tensor_ptr(sizes, std::vector<float>(n, 0.f));
}

et::OpFunction ours(const char* name) {
  for (const auto& k : far::step_kernels())
    if (k.kernel_key_.is_fallback() && std::strcmp(k.name_, name) == 0) return k.op_;
  return nullptr;
}

// Runs `name` on `args` (its inputs; the out tensor and the returned value are appended) with far's kernel into
// `mine` and with the wheel's into `theirs`.
void run_both(const char* name, std::vector<et::EValue> args, const TensorPtr& mine, const TensorPtr& theirs) {
  auto wheel = et::get_op_function_from_registry(name, {});
  CHECK(wheel.ok());
  const et::OpFunction fast = ours(name);
  CHECK(fast != nullptr && fast != wheel.get());
  if (!wheel.ok() || !fast) return;
  for (int side = 0; side < 2; ++side) {
    std::vector<et::EValue> stack = args;
    stack.emplace_back(side == 0 ? *mine : *theirs);
    stack.emplace_back(side == 0 ? *mine : *theirs);
    std::vector<et::EValue*> ptrs;
    for (auto& v : stack) ptrs.push_back(&v);
    et::KernelRuntimeContext ctx;
    (side == 0 ? fast : wheel.get())(ctx, {ptrs.data(), ptrs.size()});
    CHECK(ctx.failure_state() == et::Error::Ok);
  }
}

// The largest |mine - theirs| over the largest |theirs| (0 when they are equal).
double gap(const TensorPtr& mine, const TensorPtr& theirs) {
  const float *a = mine->const_data_ptr<float>(), *b = theirs->const_data_ptr<float>();
  double diff = 0, scale = 1e-30;
  for (ssize_t i = 0; i < theirs->numel(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

struct Counted {
  far::KernelCalls before = far::kernel_calls();
  // Whether exactly `own` calls were computed by far's kernels and `handed` handed over since construction.
  bool are(uint64_t own, uint64_t handed) const {
    const auto now = far::kernel_calls();
    return now.own - before.own == own && now.handed - before.handed == handed;
  }
};

void linear(const std::vector<SizesType>& x_sizes, SizesType n, bool bias, bool own) {
  const SizesType k = x_sizes.back();
  auto x = random(x_sizes), w = random({n, k}), b = random({n});
  std::vector<SizesType> out_sizes = x_sizes;
  out_sizes.back() = n;
  auto mine = zeros(out_sizes), theirs = zeros(out_sizes);
  Counted counted;
  run_both("aten::linear.out", {et::EValue(*x), et::EValue(*w), bias ? et::EValue(*b) : et::EValue()}, mine, theirs);
  CHECK(counted.are(own ? 1 : 0, own ? 0 : 1));
  CHECK(own ? gap(mine, theirs) < 1e-5 : gap(mine, theirs) == 0);
}

void mm(SizesType m, SizesType k, SizesType n, bool own) {
  auto a = random({m, k}), b = random({k, n});
  auto mine = zeros({m, n}), theirs = zeros({m, n});
  Counted counted;
  run_both("aten::mm.out", {et::EValue(*a), et::EValue(*b)}, mine, theirs);
  CHECK(counted.are(own ? 1 : 0, own ? 0 : 1));
  CHECK(own ? gap(mine, theirs) < 1e-5 : gap(mine, theirs) == 0);
}

void bmm(SizesType batch, SizesType m, SizesType k, SizesType n) {
  auto a = random({batch, m, k}), b = random({batch, k, n});
  auto mine = zeros({batch, m, n}), theirs = zeros({batch, m, n});
  Counted counted;
  run_both("aten::bmm.out", {et::EValue(*a), et::EValue(*b)}, mine, theirs);
  CHECK(counted.are(1, 0));
  CHECK(gap(mine, theirs) < 1e-5);
}

void permute(const std::vector<SizesType>& sizes, std::vector<int64_t> dims) {
  auto x = random(sizes);
  std::vector<SizesType> out_sizes;
  for (auto d : dims) out_sizes.push_back(sizes[d < 0 ? d + sizes.size() : d]);
  auto mine = zeros(out_sizes), theirs = zeros(out_sizes);
  std::vector<et::EValue> boxed(dims.begin(), dims.end());
  std::vector<et::EValue*> wrapped;
  for (auto& v : boxed) wrapped.push_back(&v);
  std::vector<int64_t> unwrapped(dims.size());
  et::BoxedEvalueList<int64_t> list(wrapped.data(), unwrapped.data(), static_cast<int>(dims.size()));
  Counted counted;
  run_both("aten::permute_copy.out", {et::EValue(*x), et::EValue(&list)}, mine, theirs);
  CHECK(counted.are(1, 0));
  CHECK(gap(mine, theirs) == 0);
}

// `x` (bfloat16 or int8) read into float32 by far's kernel and by the wheel's: the same bits.
void check_widened(const TensorPtr& x) {
  const std::vector<SizesType> sizes(x->sizes().begin(), x->sizes().end());
  auto mine = zeros(sizes), theirs = zeros(sizes);
  Counted counted;
  run_both("dim_order_ops::_to_dim_order_copy.out", {et::EValue(*x), et::EValue(false), et::EValue()}, mine, theirs);
  CHECK(counted.are(1, 0));
  CHECK(std::memcmp(mine->const_data_ptr(), theirs->const_data_ptr(), x->numel() * sizeof(float)) == 0);
}

void widen(const std::vector<SizesType>& sizes) {
  size_t n = 1;
  for (auto s : sizes) n *= s;
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<BFloat16> v(n);
  for (auto& x : v) x = BFloat16(u(rng));
  v[0] = BFloat16(-0.f);
  v[n - 1] = BFloat16(std::numeric_limits<float>::infinity());
  check_widened(make_tensor_ptr(sizes, std::move(v)));
}

// An elementwise operator on `inputs` (then `scalars`, boxed as they are), out shaped like the first input.
double elementwise(const char* name, const std::vector<TensorPtr>& inputs, std::vector<et::EValue> scalars,
                   bool own) {
  std::vector<SizesType> sizes(inputs[0]->sizes().begin(), inputs[0]->sizes().end());
  for (const auto& t : inputs)
    if (t->numel() > inputs[0]->numel()) sizes.assign(t->sizes().begin(), t->sizes().end());
  auto mine = zeros(sizes), theirs = zeros(sizes);
  std::vector<et::EValue> args;
  for (const auto& t : inputs) args.emplace_back(*t);
  for (auto& v : scalars) args.push_back(v);
  Counted counted;
  run_both(name, args, mine, theirs);
  CHECK(counted.are(own ? 1 : 0, own ? 0 : 1));
  return gap(mine, theirs);
}

TensorPtr mask(const std::vector<SizesType>& sizes) {
  size_t n = 1;
  for (auto s : sizes) n *= s;
  std::vector<bool> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = (rng() & 1) != 0;
  auto t = make_tensor_ptr(sizes, std::vector<uint8_t>(n), {}, {}, executorch::aten::ScalarType::Bool);
  for (size_t i = 0; i < n; ++i) t->mutable_data_ptr<bool>()[i] = bits[i];
  return t;
}

void widen_int8(const std::vector<SizesType>& sizes) {
  size_t n = 1;
  for (auto s : sizes) n *= s;
  std::vector<int8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int8_t>(static_cast<int>(i * 37) % 256 - 128);
  check_widened(make_tensor_ptr(sizes, std::move(v)));
}

}  // namespace

int main() {
  et::runtime_init();
  if (far::step_kernels().size() == 0) {
    std::printf("kernels: FAR_KERNELS=wheel or no XNNPACK on this CPU, nothing to compare\n");
    return 77;  // ctest's SKIP_RETURN_CODE
  }
  // One weight block, no bias; a batch of sequences (three dimensions).
  linear({2, 37, 96}, 150, false, true);
  // Output columns in blocks (20,000 x 64 float32 weights is 5 MB, over kPackBytes), with a bias.
  linear({16, 64}, 20000, true, true);
  // One token (decoding): handed to the wheel's kernel.
  linear({1, 1, 96}, 150, true, false);
  mm(33, 70, 45, true);
  // The reduction in blocks (a 20,000 x 64 right operand), summed.
  mm(24, 20000, 64, true);
  mm(3, 70, 45, false);
  mm(300, 70, 1, false);  // decoding's W @ x^T: one column
  bmm(6, 17, 32, 19);
  permute({2, 5, 7, 3}, {0, 2, 1, 3});
  permute({40, 30}, {1, 0});
  permute({3, 4, 5}, {-1, 0, 1});
  widen({3, 50});
  widen_int8({7, 64});
  auto x = random({4, 9, 33});
  CHECK(elementwise("aten::exp.out", {x}, {}, true) < 1e-6);
  CHECK(elementwise("aten::sigmoid.out", {x}, {}, true) < 1e-6);
  // x * x is the square rounded once; the wheel's powf is within an ulp of it.
  CHECK(elementwise("aten::pow.Tensor_Scalar_out", {x}, {et::EValue(2.0)}, true) < 1e-6);
  CHECK(elementwise("aten::pow.Tensor_Scalar_out", {x}, {et::EValue(int64_t{2})}, true) < 1e-6);
  CHECK(elementwise("aten::pow.Tensor_Scalar_out", {x}, {et::EValue(3.0)}, false) == 0);
  // masked_fill's where: a [1, 1, T, T] mask over scores [B, H, T, T], a single fill value either side.
  auto scores = random({2, 3, 5, 5}), fill = random({});
  CHECK(elementwise("aten::where.self_out", {mask({1, 1, 5, 5}), fill, scores}, {}, true) == 0);
  CHECK(elementwise("aten::where.self_out", {mask({5, 5}), scores, fill}, {}, true) == 0);
  CHECK(elementwise("aten::where.self_out", {mask({2, 3, 5, 5}), scores, random({2, 3, 5, 5})}, {}, true) == 0);
  // A mask that broadcasts inside (a column): handed over.
  CHECK(elementwise("aten::where.self_out", {mask({5, 1}), scores, fill}, {}, false) == 0);
  return far::test::finish("kernels");
}
