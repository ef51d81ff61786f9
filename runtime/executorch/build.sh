#!/usr/bin/env bash
# Configure and build far_train and its C++ tests into runtime/executorch/build/ (run them: ctest --test-dir BUILD).
#   bash runtime/executorch/build.sh [PYTHON]     PYTHON: an interpreter with executorch (default: the repo's .venv-device,
#                                                 which .ci/setup makes with the device extra; else .venv)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${1:-${PYTHON:-}}"
if [ -z "$python" ]; then
  for env in .venv-device .venv; do
    if [ -x "$root/$env/bin/python" ]; then python="$root/$env/bin/python"; break; fi
  done
  python="${python:-$(command -v python3)}"
fi
build="${FAR_TRAIN_BUILD_DIR:-$here/build}"
for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool not found; install CMake (>= 3.19) and a C++17 compiler" >&2; exit 1; }
done
if ! root_et="$("$python" -c 'import executorch; print(list(executorch.__path__)[0])' 2>/dev/null)" \
   || [ ! -d "$root_et/lib/cmake/executorch" ]; then
  echo "build.sh: executorch is not installed for $python." >&2
  echo "          Install it (\`$python -m pip install executorch==1.5.1\`) or pass a python that has it: bash $0 PYTHON" >&2
  exit 1
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$here" -B "$build" "${generator[@]}" -DPython_EXECUTABLE="$python" \
  -Dexecutorch_DIR="$root_et/lib/cmake/executorch" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "${FAR_TRAIN_JOBS:-2}"
echo "built $build/far_train (C++ tests: ctest --test-dir $build)"
