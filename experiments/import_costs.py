"""What an import or a first call costs in resident memory, in a fresh process that has imported torch.

Each row's statement runs in its own process, `--repeats` times; a run's figure is the growth of the peak
resident set over the statement (`ru_maxrss`), and the row keeps the median. These are the imports and first
calls that far's lean paths avoid (docs/design.md, "What imports cost"); the environment matters (transformers
imports torchao with its model code where torchao is installed), so the file records the versions and whether
torchao is there.

    python experiments/import_costs.py          # -> experiments/results/import_costs/import_costs.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import statistics
import subprocess
import sys

from harness import add_output_argument, command_line, machine, results_dir, write_report

# (what is avoided, statement, where far avoids it)
ROWS = [
    ("transformers' model code (torch._dynamo, sympy, scipy, accelerate)",
     "import transformers.models.bert.modeling_bert",
     "`far.encoder`, `--runtime lean` (`far.models.RUNTIMES`)"),
    ("transformers' config classes", "import transformers.models.bert.configuration_bert",
     "none: the lean encoder uses `BertConfig`"),
    ("`datasets` (pandas, pyarrow)", "import datasets",
     "`far.data.table`, `far.data.prompts.read_labelled_tsv`, `far.data.glue` (imported where used)"),
    ("`datasets` and `evaluate`", "import datasets, evaluate", "`far.evaluation.scores` (numpy)"),
    ("`datasets` and transformers' model code", "import datasets, transformers.models.bert.modeling_bert",
     "`far.lazy`: the lean causal-LM path"),
    ("a `torch.optim` optimizer's first parameter group (torch._dynamo, sympy)",
     "torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)", "`far.training.adamw.FusedAdamW`"),
    ("`torch.utils.checkpoint`'s first call (torch._dynamo, sympy)",
     "import torch.utils.checkpoint as c; c.checkpoint(torch.nn.Linear(8, 8), torch.randn(2, 8, requires_grad=True),"
     " use_reentrant=False).sum().backward()",
     "`_Recompute` in `far.encoder.bert`, `Recompute` in `far.llm.recompute`"),
    ("`torch.autograd.backward(out, grad)`'s first call (symbolic shapes, sympy)",
     "x = torch.ones(4, requires_grad=True); torch.autograd.backward(x * 2, torch.ones(4))",
     "`(out * grad).sum().backward()` in `far.llm.lean_model`"),
    ("an `nn.Embedding` built on the meta device (sympy, through the meta kernels)",
     "torch.nn.Embedding(30522, 384, device='meta')", "`far.encoder.loading` builds on the CPU"),
]  # fmt: skip
PROGRAM = (
    "import resource, torch; peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024; "
    "before = peak(); {statement}; print(peak() - before)"
)
PACKAGES = ("torch", "transformers", "datasets", "evaluate", "torchao")


def growth_mib(statement: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(statement=statement)], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per statement; the median is kept")
    add_output_argument(parser, results_dir(__file__) / "import_costs.json", "the JSON report")
    args = parser.parse_args(argv)
    rows = []
    for what, statement, where in ROWS:
        runs = [growth_mib(statement) for _ in range(args.repeats)]
        mib = statistics.median(runs)
        rows.append({"what": what, "statement": statement, "where": where, "mib": mib, "runs": runs})
        print(f"{mib:8.1f} MiB  {statement}", flush=True)
    write_report(
        args.output,
        {
            "command": command_line(__file__, argv),
            "program": PROGRAM,
            "versions": {name: version(name) for name in PACKAGES},
            "torchao_importable": importlib.util.find_spec("torchao") is not None,
            "machine": machine(),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
