// The batch order (far::epoch_order) is far/device/order.py's, case for case: a run begun in Python and
// resumed here visits the same batches.
#include <cstdint>
#include <vector>

#include "check.h"
#include "far/examples.h"
#include "reference.h"

int main(int argc, char** argv) {
  const far::Json ref = far::test::load_reference(argc > 1 ? argv[1] : "tests/data");
  for (const auto& c : ref["order"]) {
    const auto expected = c["order"].get<std::vector<int64_t>>();
    CHECK(far::epoch_order(c["seed"].get<uint64_t>(), c["epoch"].get<int64_t>(), c["n"].get<int64_t>()) == expected);
  }
  CHECK(ref["order"].size() >= 5);
  // SplitMix64's published first output for state 0 (Vigna's reference implementation: next() from x = 0).
  CHECK(far::splitmix64(0) == 0xE220A8397B1DCDAFULL);
  // Another epoch is another order; the same (seed, epoch) always the same one.
  CHECK(far::epoch_order(7, 0, 22) != far::epoch_order(7, 1, 22));
  CHECK(far::epoch_order(7, 2, 22) == far::epoch_order(7, 2, 22));
  return far::test::finish("order");
}
