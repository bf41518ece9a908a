"""W6: next-character prediction on LEAF's Shakespeare under record-level DP-SGD (issue 51).

    python benchmarks/w6.py [--root DIR] [--batch 16] [--steps 40] [--vmap-steps 3]
                            [--models char_transformer char_lstm]

One client of LEAF's Shakespeare (roles as clients: the role with the most training
windows), read by raydpfl's own `shakespeare` reader from ``--root`` (or the default data
root); where the real files are absent, a fixture in LEAF's exact JSON format is written
to a temporary folder first (roles of a public-domain passage, 80-character windows, the
next character as the label) and read the same way, and the output says so. Poisson
batches of expected size ``--batch`` (q = batch/|D|) are drawn once (empty ones
skipped: Opacus cannot take them) and every path below steps through the same batches,
in one process, one torch thread, taking turns step by step in a shuffled order (as
`benchmarks/dp_step.py` does), each path with its own copy of the same initial model:

- ``sgd``: the non-private floor (forward, cross entropy summed over the expected batch,
  backward, ``torch.optim.SGD``);
- ``raydpfl``: raydpfl's DP-SGD step (`raydpfl.privacy.per_sample.dpsgd.dp_sgd_step_`) on
  the engine ``runtime.engine: auto`` picks (book-keeping, with the `raydpfl.privacy.per_sample`
  rules), ``privacy.noise_sampler: boxmuller``;
- ``vmap``: the same step on the torch.func engine (`PerSampleGradients`: what these
  models ran on before the per-sample rules), timed on the first ``--vmap-steps``
  batches only (it is slow);
- ``vmap_nn_lstm`` (LSTM only): the path an LSTM had before this work, the same
  architecture on torch's fused ``nn.LSTM`` (no per-sample rule), on the torch.func
  engine; timed on the first ``--nn-lstm-steps`` batches (it is slower still). The LSTM
  target is against it; the ratio to ``vmap`` (the same DPLSTM under vmap) is shown too;
- ``opacus_hooks`` / ``opacus_ghost``: Opacus 1.6's ``make_private`` (hooks, and ghost
  clipping where Opacus takes the model: its ghost mode refuses a layer called more
  than once, so not the LSTM), ``poisson_sampling=False`` so it steps through the same
  batches; the faster of the two is "Opacus' best".

σ = 1, C = 1, lr 0.05. Models: ``char_transformer`` (width 64, 4 heads, 2 blocks),
``char_lstm`` (LEAF's: embedding 8, 2 LSTM layers of 256) and ``char_transformer_lora``
(configs/shakespeare_lora.yaml's: the transformer frozen, r = 8 adapters), 80-token
windows; for LoRA the table also gives its DP step and upload (the trained values)
against full fine-tuning's. Prints the
median ms per step of each path and the targets, each met or missed: the DP step
≤ 1.5× the non-private step; ≥ 2× faster than Opacus' best; the LSTM ≥ 20× faster than
the vmap path it had (``vmap_nn_lstm``); with the 1-minute load average before and after. Writes
benchmarks/results/w6-<UTC>.json. `clipped_sum_deltas` (σ = 0) is what
tests/benchmarks/test_w6.py checks: the timed DP paths compute the same clipped sum.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _results import write_result  # noqa: E402
from torch import nn  # noqa: E402

import raydpfl.config.schema  # noqa: E402, F401  (registers the text models)
from raydpfl.models import build_model  # noqa: E402
from raydpfl.privacy.noise.noise_samplers import seeded_stream  # noqa: E402
from raydpfl.privacy.per_sample import dpsgd  # noqa: E402
from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping  # noqa: E402
from raydpfl.privacy.per_sample.engines import make_engine  # noqa: E402

WINDOW = 80
CLIP, SIGMA, LR = 1.0, 1.0, 0.05
MODELS = {
    "char_transformer": {"width": 64, "heads": 4, "layers": 2},
    "char_lstm": {"embed": 8, "hidden": 256, "layers": 2},
    # the LoRA preset's model: the transformer above frozen, r = 8 adapters on its
    # attention and MLP layers (the base from a seed: step times do not depend on it)
    "char_transformer_lora": {"width": 64, "heads": 4, "layers": 2, "rank": 8},
}
#: Targets (issue 51): DP step / non-private step; Opacus' best / DP step; vmap / DP (LSTM).
DP_OVER_SGD_MAX, OPACUS_OVER_DP_MIN, LSTM_VMAP_OVER_DP_MIN = 1.5, 2.0, 20.0

#: A public-domain passage (Hamlet III.1) for the fixture, split among three roles.
PASSAGE = (
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
    "The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles "
    "And by opposing end them. To die: to sleep; No more; and by a sleep to say we end "
    "The heart-ache and the thousand natural shocks That flesh is heir to, 'tis a "
    "consummation Devoutly to be wish'd. To die, to sleep; To sleep: perchance to dream: "
    "ay, there's the rub; For in that sleep of death what dreams may come When we have "
    "shuffled off this mortal coil, Must give us pause: there's the respect That makes "
    "calamity of so long life; "
)


# ---- data ---------------------------------------------------------------------------
def write_fixture(root: Path, windows_per_role: int = 400) -> Path:
    """Writes LEAF-format Shakespeare (``shakespeare/{train,test}/*.json``) under `root`:
    three roles, each a run of 80-character windows over the passage (offset per role)
    with the next character as y. Returns `root`."""
    text = PASSAGE * (windows_per_role // len(PASSAGE) + 3)
    roles = {"HAMLET": 0, "OPHELIA": 101, "POLONIUS": 257}
    for split, count in (("train", windows_per_role), ("test", windows_per_role // 8)):
        users = {}
        for role, offset in roles.items():
            start = offset + (windows_per_role if split == "test" else 0)
            xs = [text[start + i : start + i + WINDOW] for i in range(count)]
            users[role] = {"x": xs, "y": [text[start + i + WINDOW] for i in range(count)]}
        doc = {
            "users": list(users),
            "num_samples": [len(u["y"]) for u in users.values()],
            "user_data": users,
        }
        folder = root / "shakespeare" / split
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "all_data.json").write_text(json.dumps(doc))
    return root


def client_records(root: str | None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(x, y, source): the training windows of the role with the most of them."""
    from raydpfl.data.datasets import DatasetNotFoundError
    from raydpfl.data.readers import load_shakespeare

    try:
        data, source = load_shakespeare(root), "LEAF Shakespeare"
    except DatasetNotFoundError:
        tmp = Path(tempfile.mkdtemp(prefix="w6-shakespeare-"))
        data = load_shakespeare(write_fixture(tmp))
        source = "generated fixture in LEAF's format (real Shakespeare files not found)"
    ids = torch.from_numpy(data.client_ids)
    largest = int(torch.bincount(ids).argmax())
    keep = ids == largest
    x = torch.from_numpy(data.x_train)[keep]
    y = torch.from_numpy(data.y_train)[keep]
    return x, y, f"{source}; role {data.client_names[largest]!r}, {len(y)} windows"


def poisson_batches(n: int, batch: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    """`count` non-empty Poisson samples of rate batch/n (indices), from one stream."""
    g = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    while len(out) < count:
        rows = dpsgd.poisson_sample(n, min(1.0, batch / n), g)
        if rows.numel():
            out.append(rows)
    return out


# ---- the paths ----------------------------------------------------------------------
class TorchLSTMChar(nn.Module):
    """`raydpfl.models.text.CharLSTM`'s architecture on torch's fused nn.LSTM: the model
    an LSTM user had before `DPLSTM` (no per-sample rule: the vmap engine)."""

    def __init__(self, embed: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(80, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 80)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens.long()))[0][:, -1])


Step = Callable[[torch.Tensor, torch.Tensor], None]


def _model(name: str, options: dict[str, int], start: dict[str, torch.Tensor]) -> nn.Module:
    model = build_model(name, (WINDOW,), 80, **options)
    model.load_state_dict(start)
    return model


def make_paths(
    name: str,
    options: dict[str, int],
    start: dict[str, torch.Tensor],
    expected_batch: float,
    *,
    noise_multiplier: float = SIGMA,
    lr: float = LR,
    records: int = 1000,
    with_nn_lstm: bool = False,
) -> dict[str, tuple[nn.Module, Step]]:
    """{path: (its model, its step)}: each path trains its own copy of `start`."""
    paths: dict[str, tuple[nn.Module, Step]] = {}

    floor = _model(name, options, start)
    opt = torch.optim.SGD(floor.parameters(), lr=lr)

    def sgd(xb: torch.Tensor, yb: torch.Tensor) -> None:
        loss = F.cross_entropy(floor(xb), yb, reduction="sum") / expected_batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    paths["sgd"] = (floor, sgd)

    def dp(kind: str) -> tuple[nn.Module, Step]:
        model = _model(name, options, start)
        engine = make_engine(model, kind)
        params = {k: p.detach() for k, p in model.named_parameters()}
        generator = seeded_stream("boxmuller", 0)

        def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
            dpsgd.dp_sgd_step_(
                engine,
                params,
                xb,
                yb,
                lr=lr,
                clip_norm=CLIP,
                noise_multiplier=noise_multiplier,
                expected_batch_size=expected_batch,
                generator=generator,
            )

        return model, step

    paths["raydpfl"] = dp("auto")
    assert isinstance(paths["raydpfl"][0], nn.Module)
    paths["vmap"] = dp("vmap")
    if name == "char_lstm" and with_nn_lstm:
        torch_lstm = TorchLSTMChar(**options)
        with warnings.catch_warnings():  # "no per-sample rule": the point of this path
            warnings.simplefilter("ignore")
            engine = make_engine(torch_lstm, "auto")
        params_nn = {k: p.detach() for k, p in torch_lstm.named_parameters()}
        gen_nn = seeded_stream("boxmuller", 0)

        def vmap_nn_lstm(xb: torch.Tensor, yb: torch.Tensor) -> None:
            dpsgd.dp_sgd_step_(
                engine,
                params_nn,
                xb,
                yb,
                lr=lr,
                clip_norm=CLIP,
                noise_multiplier=noise_multiplier,
                expected_batch_size=expected_batch,
                generator=gen_nn,
            )

        paths["vmap_nn_lstm"] = (torch_lstm, vmap_nn_lstm)
    for mode in ("hooks", "ghost"):
        made = _opacus(name, options, start, mode, expected_batch, noise_multiplier, lr, records)
        if made is not None:
            paths[f"opacus_{mode}"] = made
    return paths


def _opacus(
    name: str,
    options: dict[str, int],
    start: dict[str, torch.Tensor],
    mode: str,
    expected_batch: float,
    noise_multiplier: float,
    lr: float,
    records: int,
) -> tuple[nn.Module, Step] | None:
    """Opacus' DP-SGD step in `mode` ("hooks" or "ghost") on the same model, or None
    where Opacus refuses it (ghost clipping: a layer called more than once)."""
    from opacus import PrivacyEngine

    if mode == "ghost" and name == "char_lstm":
        return None  # "Parameter tying is not supported with Ghost Clipping" (hh per step)
    model = _model(name, options, start)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    # A loader only to tell Opacus the expected batch (len(dataset)·sample_rate); the
    # steps are fed the shared batches directly.
    batch = max(1, round(expected_batch))
    dataset = torch.utils.data.TensorDataset(
        torch.zeros(batch * max(1, records // batch), WINDOW, dtype=torch.long),
        torch.zeros(batch * max(1, records // batch), dtype=torch.long),
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch)
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=CLIP,
            poisson_sampling=False,
            grad_sample_mode=mode,
            **({"criterion": nn.CrossEntropyLoss()} if mode == "ghost" else {}),
        )
    private, optimizer = made[0], made[1]
    optimizer.expected_batch_size = expected_batch
    criterion = made[2] if mode == "ghost" else nn.CrossEntropyLoss()

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(private(xb), yb)
        loss.backward()
        optimizer.step()

    return private, step


def clipped_sum_deltas(
    name: str, options: dict[str, int], x: torch.Tensor, y: torch.Tensor, expected_batch: float
) -> dict[str, dict[str, torch.Tensor]]:
    """{DP path: {parameter: Δθ·B/lr}} after one σ = 0 step from one start: each path's
    clipped sum Σ_i min(1, C/‖g_i‖) g_i, as its timed step computes it."""
    torch.manual_seed(0)
    start = build_model(name, (WINDOW,), 80, **options).state_dict()
    paths = make_paths(name, options, start, expected_batch, noise_multiplier=0.0, lr=1.0)
    out = {}
    for path, (model, step) in paths.items():
        if path == "sgd":
            continue
        step(x, y)
        after = dict(model.named_parameters())
        names = [k.removeprefix("_module.") for k in after]
        out[path] = {
            k: (start[k] - p.detach()) * expected_batch
            for k, p in zip(names, after.values(), strict=True)
        }
    return out


# ---- the run ------------------------------------------------------------------------
def _time_model(
    name: str, x: torch.Tensor, y: torch.Tensor, batches: list[torch.Tensor], args: Any
) -> dict[str, Any]:
    torch.manual_seed(0)
    options = MODELS[name]
    start = build_model(name, (WINDOW,), 80, **options).state_dict()
    paths = make_paths(name, options, start, float(args.batch), records=len(y), with_nn_lstm=True)
    assert isinstance(make_engine(paths["raydpfl"][0], "auto"), BookkeepingClipping)
    steps = {path: step for path, (_, step) in paths.items()}
    limit = {"vmap": args.vmap_steps, "vmap_nn_lstm": args.nn_lstm_steps}
    for path, fn in steps.items():  # warm-up (allocator, numba cache, Opacus hooks)
        for rows in batches[: 1 if path in limit else 2]:
            fn(x[rows], y[rows])
    times: dict[str, list[float]] = {path: [] for path in steps}
    shuffle = random.Random(0)
    for i, rows in enumerate(batches[2:]):  # after the 2 warm-up batches
        xb, yb = x[rows], y[rows]
        order = [p for p in steps if i < limit.get(p, len(batches))]
        shuffle.shuffle(order)
        for path in order:
            t = time.perf_counter()
            steps[path](xb, yb)
            times[path].append((time.perf_counter() - t) * 1e3)
    med = {path: statistics.median(v) for path, v in times.items()}
    opacus = {p: med[p] for p in med if p.startswith("opacus_")}
    best = min(opacus, key=opacus.__getitem__)
    targets = {
        "dp_over_sgd": (med["raydpfl"] / med["sgd"], DP_OVER_SGD_MAX, "<="),
        "opacus_best_over_dp": (opacus[best] / med["raydpfl"], OPACUS_OVER_DP_MIN, ">="),
    }
    if name == "char_lstm":
        targets["vmap_over_dp"] = (
            med["vmap_nn_lstm"] / med["raydpfl"],
            LSTM_VMAP_OVER_DP_MIN,
            ">=",
        )
        targets["same_model_vmap_over_dp"] = (
            med["vmap"] / med["raydpfl"],
            LSTM_VMAP_OVER_DP_MIN,
            ">=",
        )
    return {
        "options": options,
        "parameters": sum(p.numel() for p in paths["sgd"][0].parameters()),
        "median_ms": med,
        "steps": {p: len(v) for p, v in times.items()},
        "opacus_best": best,
        "targets": {
            k: {"value": v, "bound": b, "met": v <= b if op == "<=" else v >= b, "op": op}
            for k, (v, b, op) in targets.items()
        },
    }


def _cell(targets: dict[str, Any], key: str) -> str:
    if key not in targets:
        return "–"
    t = targets[key]
    return f"{t['value']:.2f}× {'met' if t['met'] else 'missed'}"


def _ms(med: dict[str, float], path: str) -> str:
    return f"{med[path]:,.1f} ms" if path in med else "refused"


def table(figures: dict[str, Any]) -> str:
    """The README table (markdown) of `main`'s figures."""
    lines = [
        "| model | trained (uploaded) values | non-private | raydpfl DP | vmap DP "
        "| Opacus hooks | Opacus ghost "
        "| DP / non-private (≤ 1.5) | Opacus best / DP (≥ 2) "
        "| nn.LSTM on vmap / DP (≥ 20) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for name, f in figures.items():
        med, tg = f["median_ms"], f["targets"]
        lstm = _cell(tg, "vmap_over_dp")
        if "vmap_nn_lstm" in med:
            same = _cell(tg, "same_model_vmap_over_dp")
            lstm += f" ({_ms(med, 'vmap_nn_lstm')}; same DPLSTM on vmap {same})"
        row = [_ms(med, p) for p in ("sgd", "raydpfl", "vmap", "opacus_hooks", "opacus_ghost")]
        lines.append(
            f"| {name} | {f['parameters']:,} | {' | '.join(row)} | {_cell(tg, 'dp_over_sgd')} "
            f"| {_cell(tg, 'opacus_best_over_dp')} | {lstm} |"
        )
    lora, full = figures.get("char_transformer_lora"), figures.get("char_transformer")
    if lora and full:
        step = lora["median_ms"]["raydpfl"] / full["median_ms"]["raydpfl"]
        upload = lora["parameters"] / full["parameters"]
        lines.append("")
        lines.append(
            f"LoRA (r = 8) against full fine-tuning, both DP on raydpfl's engine: step "
            f"{step:.2f}×, upload {lora['parameters']:,} values against "
            f"{full['parameters']:,} ({upload:.3f}×)."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=None, help="folder holding LEAF's shakespeare/ data")
    p.add_argument("--batch", type=int, default=16, help="expected Poisson batch")
    p.add_argument("--steps", type=int, default=40, help="timed steps of each path")
    p.add_argument("--vmap-steps", type=int, default=3, help="timed steps of the vmap path")
    p.add_argument(
        "--nn-lstm-steps", type=int, default=1, help="timed steps of the nn.LSTM vmap path"
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = p.parse_args(argv)
    if args.batch < 1 or args.steps < 3 or not 1 <= args.vmap_steps <= args.steps:
        p.error("--batch must be >= 1, --steps >= 3 and 1 <= --vmap-steps <= --steps")
    if not 1 <= args.nn_lstm_steps <= args.steps:
        p.error("--nn-lstm-steps must be in [1, --steps]")
    from raydpfl.backends.allocator import tune_allocator

    torch.set_num_threads(1)
    tuned = tune_allocator()
    x, y, source = client_records(args.root)
    batches = poisson_batches(len(y), args.batch, args.steps + 2)
    load = [os.getloadavg()[0]]
    figures = {}
    for name in args.models:
        figures[name] = _time_model(name, x, y, batches, args)
        med = figures[name]["median_ms"]
        print(f"{name}: " + "  ".join(f"{k} {v:.1f} ms" for k, v in med.items()), flush=True)
    load.append(os.getloadavg()[0])
    print(table(figures))
    print(
        f"data: {source}; expected batch {args.batch} (Poisson, q = {args.batch / len(y):.4f}), "
        f"{args.steps} steps ({args.vmap_steps} for vmap, {args.nn_lstm_steps} for nn.LSTM "
        f"on vmap), 1 thread, σ = {SIGMA}, C = {CLIP}; "
        f"allocator tuned: {tuned}; 1-min load {load[0]:.2f} -> {load[1]:.2f}"
    )
    write_result(
        ROOT,
        "w6",
        {
            "data": source,
            "batch": args.batch,
            "steps": args.steps,
            "vmap_steps": args.vmap_steps,
            "nn_lstm_steps": args.nn_lstm_steps,
            "figures": figures,
            "table": table(figures),
            "loadavg_1min": load,
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "allocator_tuned": tuned,
        },
    )


if __name__ == "__main__":
    main()
