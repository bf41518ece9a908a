"""A resume that the server actor refuses while it starts reaches the driver as itself:
the same one line and exit 2 as on the local backend, and its reason in error.log.

Before: the refusal was raised by the actor's constructor, which Ray reports as the
actor's death; the driver restarted it `max_restarts` times and ended with 44-81 lines,
"the server actor died 4 times", exit 1, and a suggested `--resume` that failed again.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from raydpfl.cli.main import main
from raydpfl.cli.ray_logs import WORKER_LINES_SKIPPED
from tests.cli.test_resume_outputs import RAW, STOPS, _interrupt_resume_compare, _stop_after


def _tamper_delete_log(run_dir):
    (run_dir / "ledger_log.jsonl").unlink()


def _tamper_edit_log(run_dir):
    path = run_dir / "ledger_log.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["round"] = first["round"] + 1  # a charge moved to another round
    path.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")


def _lines(err: str) -> list[str]:
    # The session's Ray was imported before the CLI's `quiet_ray` could set its skip
    # pattern (the CLI sets it first): drop the lines the CLI's Ray never prints.
    return [ln for ln in err.strip().splitlines() if not re.search(WORKER_LINES_SKIPPED, ln)]


TAMPERS = {"log deleted": _tamper_delete_log, "log edited": _tamper_edit_log}


@pytest.mark.slow
@pytest.mark.ray
def test_a_resume_refused_in_the_server_actor_is_one_line_and_exit_2_as_locally(
    ray_session, tmp_path, monkeypatch, capsys
):
    raw = json.loads(json.dumps(RAW))
    raw["runtime"].update({"workers": 1, "cpus_per_worker": 1})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    interrupted = tmp_path / "interrupted"
    with monkeypatch.context() as patch:
        _stop_after(patch, 5, KeyboardInterrupt)
        assert main(["run", str(config), "--out", str(interrupted), "--no-progress"]) == 130
    capsys.readouterr()

    for name, tamper in TAMPERS.items():
        lines = {}
        for backend in ("local", "ray"):
            run_dir = tmp_path / f"{name.replace(' ', '-')}-{backend}"
            shutil.copytree(interrupted, run_dir)
            tamper(run_dir)
            args = ["run", "--resume", str(run_dir), "--no-progress"]
            code = main([*args, "--set", f"runtime.backend={backend}"])
            err = _lines(capsys.readouterr().err)
            assert code == 2, (name, backend, err)
            assert len(err) == 1, (name, backend, err)
            assert err[0].startswith("raydpfl: error: "), err
            assert "died" not in err[0]
            lines[backend] = err[0].replace(str(run_dir), "RUN_DIR")
            reason = err[0].removeprefix("raydpfl: error: ")
            assert reason in (run_dir / "error.log").read_text(), (name, backend)
            assert not (run_dir / "summary.json").exists()
        assert lines["ray"] == lines["local"], name


@pytest.mark.slow
@pytest.mark.ray
def test_every_output_survives_an_interruption_and_resume_on_ray(
    ray_session, tmp_path, monkeypatch
):
    # As tests/cli/test_resume_outputs.py locally: the server actor closes the outputs.
    _interrupt_resume_compare(tmp_path, monkeypatch, "ray", list(STOPS))
