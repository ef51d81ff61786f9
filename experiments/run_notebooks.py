"""Execute the notebooks in notebooks/ in place, in full mode, to refresh their committed outputs.

The notebooks read the experiments' committed results (experiments/results/<script>/), so run the
scripts that write them first; a notebook whose file is missing fails with the command that writes it,
and is left as it was. Each notebook runs in a fresh kernel with notebooks/ as its working directory.
Unlike the other scripts, its output is the notebooks themselves: in place unless `--output` names a folder.

    python experiments/run_notebooks.py                       # all three, full mode (minutes each)
    python experiments/run_notebooks.py 01_quickstart         # one of them
    python experiments/run_notebooks.py --quick --output /tmp/nb   # CI's quick mode, copies elsewhere
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from harness import add_output_argument, children_cpu_seconds
from nbclient.exceptions import CellExecutionError

from far.plotting import QUICK_ENV, run_notebook
from far.storage.atomic import atomic_file

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks to run (file names, with or without .ipynb; default: all)")
    parser.add_argument("--quick", action="store_true", help=f"the shrunk CI run (sets {QUICK_ENV}=1): never commit it")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    add_output_argument(parser, None, "write executed copies in this folder, not in place", aliases=("--output-dir",))
    args = parser.parse_args(argv)
    available = {p.stem: p for p in sorted(NOTEBOOKS.glob("*.ipynb"))}
    names = [n.removesuffix(".ipynb") for n in args.names] or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        parser.error(f"no notebook {', '.join(unknown)} in {NOTEBOOKS}; available: {', '.join(available)}")
    if args.output is None and args.quick:
        parser.error("--quick outputs are not to be committed: give --output for them")

    # The kernels inherit this environment.
    os.environ[QUICK_ENV] = "1" if args.quick else "0"
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(name, "1")
    failed, times = [], {}  # name -> (wall seconds, kernel CPU seconds)
    for name in names:
        path = available[name]
        print(f"running {path.name} ({'quick' if args.quick else 'full'} mode)...", flush=True)
        start, cpu = time.perf_counter(), children_cpu_seconds()
        try:
            nb = run_notebook(nbformat.read(path, as_version=4), args.timeout)
        except CellExecutionError as e:  # e.evalue is the notebook's own message (e.g. which script to run)
            print(f"{path.name} FAILED, left unchanged: {e.ename}: {e.evalue}", file=sys.stderr, flush=True)
            failed.append(path.name)
            continue
        # the kernels' CPU seconds: a load-independent measure of the work
        times[path.name] = (time.perf_counter() - start, children_cpu_seconds() - cpu)
        target = path if args.output is None else args.output / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(target) as tmp:
            nbformat.write(nb, tmp)
        print(f"{path.name}: {times[path.name][0]:.0f} s, wrote {target}", flush=True)
    print(f"{'notebook':<28} {'wall s':>8} {'kernel CPU s':>13}")
    for name, (wall, cpu) in times.items():
        print(f"{name:<28} {wall:8.1f} {cpu:13.1f}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
