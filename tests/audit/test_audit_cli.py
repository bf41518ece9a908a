"""`raydpfl audit`: one line and exit status 2 for bad input, naming the field."""

import json

import pytest
import yaml
from test_audit_runs import RECORD

from raydpfl.cli.main import main


@pytest.fixture
def record_yaml(tmp_path):
    path = tmp_path / "record.yaml"
    path.write_text(yaml.safe_dump(RECORD))
    return path


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--canaries", "100000"], "canaries"),
        (["--canaries", "0"], "canaries"),
        (["--confidence", "1.5"], "confidence"),
        (["--confidence", "0"], "confidence"),
        (["--mode", "grey-box"], "mode"),
        (["--set", "experiment.algorithm.name=fedavg"], "experiment.algorithm.name"),
        (
            ["--set", "experiment.privacy.noise_multiplier=0"],
            "experiment.privacy.noise_multiplier",
        ),
        (["--set", "experiment.algorithm.name=pe_dpfl"], "experiment.algorithm.name"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_field(record_yaml, capsys, args, field):
    code = main(["audit", str(record_yaml), *args])

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith(f"raydpfl: error: {field}: ")


def test_audit_prints_the_bound_beside_the_claim_and_keeps_audit_json(
    record_yaml, tmp_path, capsys
):
    out = tmp_path / "audited"

    code = main(["audit", str(record_yaml), "--canaries", "100", "--out", str(out)])

    assert code == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "record-level white-box audit: 100 canaries" in line
    assert "at 95% confidence" in line and "accountant (rdp): epsilon =" in line
    saved = json.loads((out / "audit.json").read_text())
    assert saved["canaries"] == 100 and saved["guesses"] == 20
    assert 0 <= saved["epsilon_lower_bound"] <= saved["epsilon_claimed"]
    assert (out / "summary.json").exists() and (out / "model.pt").exists()
