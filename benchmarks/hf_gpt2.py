"""A Hugging Face GPT-2 small tuned with no glue, against the oracle grid of gpu_oracle.py.

The model is ``transformers.GPT2LMHeadModel(GPT2Config())``: GPT-2 small (124 M parameters, 12
layers of d_model 768, a 50257-token vocabulary) built from its config, nothing downloaded.
The data is a ``datasets.Dataset`` of 512-token rows as a tokenizer's ``map`` leaves them
(Python lists: ``input_ids``, and ``labels``, the same ids, which the model shifts itself).
It is tuned the way the README tells a Hugging Face user to, with no glue:

- ``--road objects`` (the default): ``tune(model=model, dataset=rows)``; the model's own loss,
  the Trainer's default optimizer;
- ``--road trainer``: ``tune(trainer)``, a ``Trainer`` on default ``TrainingArguments``; its
  DataLoader, optimizer and ``compute_loss``.

Then ``gpu_oracle.compare`` trains the baseline (fp32, batch 32), the tuned profile and the
oracle grid on one training loop of that same workload, its data on the device. It prints the
table and writes ``benchmarks/results/hf_gpt2_<device>.json`` and ``.md``, with the device and
the versions (transformers and datasets too). Targets: tuned/oracle at least 0.95
(``gpu_oracle.TARGET_ORACLE``), tuned/baseline at least 1; the exit code is 1 when one is
missed. Without a GPU it exits with 2, unless ``--smoke``.

``--smoke`` runs the whole script on the CPU (also on a GPU machine) with a tiny GPT-2 (2
layers of 64, a 1000-token vocabulary, 64 tokens), a 10 s budget and no compiled arms (a
compile takes over a minute on a CPU): under a minute. It checks that the script works; its
numbers mean nothing, its targets are not checked, and its files go to a new temporary
directory unless ``--out`` names one (never ``benchmarks/results/``).

    python benchmarks/hf_gpt2.py [--road objects|trainer] [--seconds 2] [--mode speed]
        [--budget 180] [--rows 1024] [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_oracle  # the oracle grid, for this model too
from torch_autotune import detect
from torch_autotune.api import tune
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile

SEQ_LEN = 512
SMOKE_CONFIG = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 64}
SMOKE_SEQ_LEN = 64
SMOKE_ROWS = 64
SMOKE_BUDGET_S = 10.0
SMOKE_MAX_BATCH = 16


def _model(smoke: bool) -> Any:
    """GPT-2 small from ``GPT2Config()`` (a tiny one for the smoke run), seeded weights."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(**SMOKE_CONFIG) if smoke else transformers.GPT2Config()
    return transformers.GPT2LMHeadModel(config)


def _rows(count: int, seq_len: int, vocab_size: int) -> Any:
    """``count`` rows of ``seq_len`` random token ids as Python lists, labels the same ids."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (count, seq_len), generator=generator).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def _given(road: str, model: Any, rows: Any, smoke: bool) -> Any:
    """What the user hands to ``tune()`` (and the oracle's loop): a dict of the model and its
    rows, or a Trainer over them."""
    if road == "objects":
        return {"model": model, "dataset": rows}
    arguments = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf_gpt2_trainer_"), report_to="none", use_cpu=smoke
    )
    return transformers.Trainer(model=model, args=arguments, train_dataset=rows)


def _tuned(given: Any, args: argparse.Namespace) -> Profile:
    began = time.perf_counter()
    options: dict[str, Any] = {"mode": args.mode, "budget_s": args.budget}
    if args.smoke:  # the CPU, even on a GPU machine; a small cap keeps it to seconds
        machine = detect()
        options["snapshot"] = machine.model_copy(update={"accelerators": ()})
        options["max_batch_size"] = SMOKE_MAX_BATCH
    objects = given if isinstance(given, dict) else {}
    return tune(
        None if objects else given,
        **objects,
        name="GPT2LMHeadModel",
        progress=lambda phase, what: print(
            f"  [{time.perf_counter() - began:6.1f} s] {phase}: {what}", flush=True
        ),
        **options,
    )


def _workload(given: Any) -> Workload:
    if isinstance(given, dict):
        return resolve_workload(None, objects=given, name="GPT2LMHeadModel")
    return resolve_workload(given)


def _markdown(versions: dict[str, Any], result: dict[str, Any], smoke: bool) -> str:
    """gpu_oracle's report with this benchmark's title, road and versions."""
    body = gpu_oracle._markdown(versions, [result]).split("\n", 1)[1]
    lines = [
        "# Hugging Face GPT-2 small tuned with no glue, against the oracle grid on"
        f" {versions['device']}",
        "",
        f"{result['model']}; {result['road_text']}. transformers {versions['transformers']},"
        f" datasets {versions['datasets']}.",
    ]
    if smoke:
        lines += [
            "",
            "**Smoke run**: a tiny GPT-2 on the CPU, to check the script. Not a measurement.",
        ]
    return "\n".join(lines) + "\n" + body


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--road", choices=("objects", "trainer"), default="objects")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--mode", default="speed")
    parser.add_argument("--budget", type=float, default=180.0)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="a tiny GPT-2 on the CPU: seconds")
    args = parser.parse_args()
    if args.smoke:
        args.seconds = min(args.seconds, 0.2)
        args.budget = min(args.budget, SMOKE_BUDGET_S)
        args.rows = min(args.rows, SMOKE_ROWS)
        args.out = args.out or Path(tempfile.mkdtemp(prefix="hf_gpt2_smoke_"))
    else:
        args.out = args.out or gpu_oracle.RESULTS
    return args


def main() -> int:
    args = _arguments()
    versions = gpu_oracle._versions()
    versions.update(transformers=transformers.__version__, datasets=datasets.__version__)
    if versions["device"] == "cpu" and not args.smoke:
        print("hf_gpt2: no GPU here; this benchmark needs one (--smoke checks the script)")
        return 2
    if args.smoke:
        versions["device"] = "cpu (smoke)"
    model = _model(args.smoke)
    seq_len = SMOKE_SEQ_LEN if args.smoke else SEQ_LEN
    rows = _rows(args.rows, seq_len, model.config.vocab_size)
    given = _given(args.road, model, rows, args.smoke)
    print(f"GPT2LMHeadModel ({args.road}): tuning", flush=True)
    profile = _tuned(given, args)
    device = "cpu" if args.smoke else "cuda"
    result = gpu_oracle.compare(
        "GPT2LMHeadModel",
        profile,
        _workload(given),
        device,
        args.seconds,
        compiled=not args.smoke,  # one compile on the CPU: over a minute
    )
    parameters = sum(p.numel() for p in model.parameters())
    details = profile.evidence.details if profile.evidence is not None else None
    result.update(
        road=args.road,
        road_text="tune(model=model, dataset=rows)" if args.road == "objects" else "tune(trainer)",
        model=f"GPT2LMHeadModel, {parameters / 1e6:.1f} M parameters, {seq_len} tokens a row",
        details=None if details is None else details.model_dump(mode="json"),
        smoke=args.smoke,
    )
    slug = re.sub(r"[^a-z0-9]+", "-", versions["device"].lower()).strip("-")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"hf_gpt2_{args.road}_{slug}"
    report = {"versions": versions, "results": [result]}
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = _markdown(versions, result, args.smoke)
    stem.with_suffix(".md").write_text(text)
    print(text)
    print(f"written: {stem}.json and .md")
    if args.smoke:
        return 0
    below = result.get("tuned_over_baseline", 0) < 1.0
    short = result.get("tuned_over_oracle", 0) < gpu_oracle.TARGET_ORACLE
    return 1 if below or short else 0


if __name__ == "__main__":
    sys.exit(main())
