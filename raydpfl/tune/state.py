"""The sweep's own state, in JSON: which trials exist, their parameters and Tune status.

`raydpfl tune --resume` reads only this file, sweep.yaml (safe YAML) and the trials' run
directories; it never calls ``Tuner.restore``, which unpickles ``tuner.pkl``, the
searcher's state and the ``CLOUDPICKLE_FALLBACK`` entries of Tune's experiment state:
a sweep directory is not trusted (docs/architecture.md, security model), so a pickle
planted there would run its payload. Resuming builds a fresh Tuner instead:

- every trial keeps its key (its directory name under ``trials/``) and its parameters;
- a trial that had finished (Tune status TERMINATED, or its run wrote summary.json) is
  replayed: its recorded rounds are reported to Tune again without training, so the
  scheduler's rungs (ASHA) and an adaptive searcher see the same history;
- any other trial continues from its run's checkpoint, or starts again.

Random search is planned here, up front, from the sweep's sampling seed (`plan_trials`),
so the trials of a resumed sweep are the same list; an adaptive searcher (optuna,
hyperopt) proposes its trials as it goes, and a resumed one is given the recorded trials
first (``points_to_evaluate``), each matched back to its key by its parameters.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from raydpfl.config.schema import ConfigError
from raydpfl.tune.spec import Dimension, TuneSpec, plain_value

STATE_FILE = "sweep_state.json"
#: The version of `STATE_FILE`'s layout.
STATE_FORMAT = 1
#: The parameter that carries a planned trial's key through Tune (random search).
TRIAL_KEY = "raydpfl_trial"
#: Tune statuses after which a trial is replayed on resume, not trained again.
FINISHED = ("TERMINATED",)


def trial_key(index: int) -> str:
    """The key (directory name) of the `index`-th trial: ``t00000``, ``t00001``, ..."""
    return f"t{index:05d}"


def plan_trials(spec: TuneSpec, seed: int) -> dict[str, dict[str, Any]]:
    """Random search's trials, in order: for each of ``num_samples`` samples, every grid
    combination (in the order the grid values are written) with the other dimensions
    drawn from one NumPy generator seeded with `seed` (choice: uniform over the values;
    uniform; loguniform: uniform in log space; randint: both ends included)."""
    rng = np.random.default_rng(seed)
    grid = [d for d in spec.space if d.kind == "grid"]
    sampled = [d for d in spec.space if d.kind != "grid"]
    trials: dict[str, dict[str, Any]] = {}
    for _ in range(spec.num_samples):
        for combo in itertools.product(*(d.values for d in grid)):
            params = {d.key: v for d, v in zip(grid, combo, strict=True)}
            params.update({d.key: _draw(d, rng) for d in sampled})
            trials[trial_key(len(trials))] = {d.key: params[d.key] for d in spec.space}
    return trials


def _draw(d: Dimension, rng: np.random.Generator) -> Any:
    if d.kind == "choice":
        return d.values[int(rng.integers(len(d.values)))]
    low, high = float(d.low), float(d.high)  # type: ignore[arg-type]
    if d.kind == "uniform":
        return float(rng.uniform(low, high))
    if d.kind == "loguniform":
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    return int(rng.integers(int(low), int(high) + 1))  # randint


class SweepState:
    """`STATE_FILE`: the trials (key → parameters, Tune status), the plug-ins, and the
    Python objects the trials used instead of config entries (``{"model":
    "python:my_module.MyNet"}``: such a sweep resumes from Python only)."""

    def __init__(
        self,
        path: Path,
        plugins: tuple[str, ...] = (),
        objects: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.plugins = tuple(plugins)
        self.objects = dict(objects or {})
        self.params: dict[str, dict[str, Any]] = {}
        self.status: dict[str, str] = {}
        self._claimed: set[str] = set()

    @classmethod
    def read(cls, sweep_dir: Path) -> SweepState:
        """The state a sweep wrote (JSON only: nothing here is unpickled).

        Raises:
            ConfigError: No state file (a sweep directory of an older raydpfl, whose
                Ray Tune state is pickled and is not loaded), or a broken one.
        """
        path = sweep_dir / STATE_FILE
        if not path.is_file():
            raise ConfigError(
                "resume",
                f"{sweep_dir} has no {STATE_FILE}, so it cannot be resumed safely (Ray "
                "Tune's own state is pickled and raydpfl never loads it); start the sweep "
                "again with `raydpfl tune SWEEP_FILE`",
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != STATE_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {STATE_FORMAT}")
            objects = {str(k): str(v) for k, v in dict(data.get("objects", {})).items()}
            state = cls(path, tuple(str(p) for p in data.get("plugins", ())), objects)
            for row in data["trials"]:
                key = str(row["key"])
                state.params[key] = {str(k): v for k, v in dict(row["params"]).items()}
                if row.get("status") is not None:
                    state.status[key] = str(row["status"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError("resume", f"{path} cannot be read: {e}") from None
        return state

    def write(self) -> None:
        """Replaces the file atomically (a kill leaves the old one or the new one)."""
        data = {
            "format": STATE_FORMAT,
            "plugins": list(self.plugins),
            "objects": self.objects,
            "trials": [
                {"key": k, "params": self.params[k], "status": self.status.get(k)}
                for k in sorted(self.params)
            ],
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
        os.replace(tmp, self.path)

    def finished(self, trials_dir: Path) -> frozenset[str]:
        """Trials to replay: finished by Tune's account, or whose run (under `trials_dir`)
        wrote summary.json."""
        done = {k for k, s in self.status.items() if s in FINISHED}
        done |= {k for k in self.params if (trials_dir / k / "summary.json").exists()}
        return frozenset(done)

    def key_for(self, config: Mapping[str, Any], keys: tuple[str, ...]) -> str:
        """The key of the trial Tune just created with `config` (its dimensions `keys`):
        a planned trial's own, else the first unclaimed recorded trial with the same
        parameters (a resumed adaptive search), else a new one (recorded)."""
        planned = config.get(TRIAL_KEY)
        if planned is not None:
            self._claimed.add(str(planned))
            return str(planned)
        params = {k: plain_value(config[k]) for k in keys if k in config}
        for key in sorted(self.params):
            if key not in self._claimed and _same(self.params[key], params):
                self._claimed.add(key)
                return key
        key = trial_key(len(self.params))
        self.params[key] = params
        self._claimed.add(key)
        self.write()
        return key

    def set_statuses(self, statuses: Mapping[str, str]) -> None:
        """Records Tune's statuses (key → status); writes the file when one changed."""
        changed = {k: s for k, s in statuses.items() if self.status.get(k) != s}
        if changed:
            self.status.update(changed)
            self.write()


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal parameters (JSON round trips floats exactly; ints and floats compare)."""
    return set(a) == set(b) and all(a[k] == b[k] for k in a)
