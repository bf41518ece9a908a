"""Secure defaults when raydpfl starts Ray itself (no Ray instance is started here)."""

import pytest

ray = pytest.importorskip("ray")

from raydpfl.backends.ray import runner  # noqa: E402


def _capture(monkeypatch):
    calls = []
    monkeypatch.setattr(runner.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runner.ray, "init", lambda **kw: calls.append(kw))
    return calls


def test_a_local_ray_is_started_with_the_dashboard_off(monkeypatch):
    calls = _capture(monkeypatch)

    started = runner.connect(None)

    assert started is True
    assert calls[0]["include_dashboard"] is False
    assert calls[0]["address"] == "local"  # never joins whatever RAY_ADDRESS names


def test_joining_a_cluster_passes_the_address(monkeypatch):
    calls = _capture(monkeypatch)

    runner.connect("auto")

    assert calls[0]["address"] == "auto"


def test_a_running_ray_session_is_reused_and_not_owned(monkeypatch):
    monkeypatch.setattr(runner.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(runner.ray, "init", lambda **kw: pytest.fail("must not re-init"))

    assert runner.connect(None) is False
