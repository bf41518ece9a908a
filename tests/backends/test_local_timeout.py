"""`runtime.round_timeout_s` on the local backend: a plug-in that blocks stops the run in
one line (and the resume hint), as on Ray, instead of hanging forever."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml

from raydpfl.backends.local import _deadline
from raydpfl.cli.main import main
from raydpfl.simulation.backend import RoundTimeoutError
from tests.cli.test_resume_outputs import RAW

BLOCKING_PLUGIN = """
import time
import torch
import raydpfl

class Sleepy(torch.nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        time.sleep(600)  # a plug-in that blocks (a lock, a network call, a bug)
        return self.linear(x.flatten(1))

@raydpfl.register_model("sleepy_linear")
def sleepy_linear(input_shape, num_classes):
    return Sleepy(num_classes)
"""


@pytest.fixture
def forget_plugins(monkeypatch):
    from raydpfl import registry
    from raydpfl.registry import plugin_files

    before = {kind: set(registry.names(kind)) for kind in registry.KINDS}
    monkeypatch.setattr(plugin_files, "_FILES", [])
    yield
    for kind in registry.KINDS:
        for name in set(registry.names(kind)) - before[kind]:
            registry.unregister(kind, name)


def test_a_blocking_plugin_stops_at_the_round_deadline_locally(tmp_path, capsys, forget_plugins):
    plugin = tmp_path / "sleepy_plugin.py"
    plugin.write_text(BLOCKING_PLUGIN)
    raw = json.loads(json.dumps(RAW))
    raw["experiment"]["model"] = {"name": "sleepy_linear"}
    raw["runtime"]["round_timeout_s"] = 1.5
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    started = time.monotonic()
    code = main(
        ["run", str(config), "--plugin", str(plugin), "--out", str(run_dir), "--no-progress"]
    )
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    assert err[0].startswith("raydpfl: run failed: a round did not finish within 1.5 s"), err
    assert "runtime.round_timeout_s" in err[0]
    assert len(err) == 2 and err[1].startswith("raydpfl: finished rounds are kept in"), err
    assert elapsed < 60  # the plug-in sleeps 600 s per call
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL  # put back


def test_the_deadline_puts_back_an_enclosing_alarm():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        with pytest.raises(RoundTimeoutError, match=r"within 0\.2 s"), _deadline(0.2, "a round"):
            time.sleep(3)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 4.0 < left < 5.0  # the caller's timer runs on, less the 0.2 s spent
        with _deadline(1.0, "a round"):
            pass  # a block that ends in time raises nothing
        assert not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
