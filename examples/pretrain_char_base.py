"""Pre-trains the base of configs/shakespeare_lora.yaml without DP, on public text.

    python examples/pretrain_char_base.py --root DATA [--out runs/char_base.pt] [--steps 300]

The public text here is LEAF Shakespeare's *test* split (read by raydpfl's
``shakespeare`` reader from ``--root``): held out from the federated clients' training
records, so the private fine-tuning never sees it and the base costs the clients no
privacy. Trains `raydpfl.models.text.CharTransformer` (width 64, 4 heads, 2 blocks, the
preset's base) with Adam on full passes of mini-batches of 64 and saves its state dict
(``torch.save(model.state_dict())``: tensors only, which the preset reads back with
``torch.load(weights_only=True)``). Prints the file's SHA-256 for
``experiment.model.options.checkpoint_sha256``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from raydpfl.data.readers import load_shakespeare  # noqa: E402
from raydpfl.models.lora import file_sha256  # noqa: E402
from raydpfl.models.text import CharTransformer  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="folder holding LEAF's shakespeare/ data")
    p.add_argument("--out", default="runs/char_base.pt")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    data = load_shakespeare(args.root)
    x, y = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    torch.manual_seed(args.seed)
    model = CharTransformer((80,), 80, width=64, heads=4, layers=2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        rows = torch.randint(0, len(y), (64,), generator=g)
        loss = F.cross_entropy(model(x[rows]), y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    print(f"wrote {out} (sha256 {file_sha256(out)}), from {len(y)} public windows")


if __name__ == "__main__":
    main()
