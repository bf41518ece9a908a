"""`raydpfl validate` prints the sections a run reads, not every paper's options."""

from pathlib import Path

import yaml

from raydpfl.cli.main import main
from raydpfl.config.load import config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def _printed(capsys, *argv: str) -> tuple[dict, str]:
    assert main(["validate", str(QUICKSTART), *argv]) == 0
    out = capsys.readouterr().out
    return yaml.safe_load(out), out


def test_validate_shows_only_the_chosen_algorithms_block_and_loads_back(capsys):
    tree, out = _printed(capsys)

    algorithm = tree["experiment"]["algorithm"]
    assert not {"ali_dpfl", "pe_dpfl", "adap_dp_fl", "fedfdp", "dpfl_bcs", "rc_dpfl"} & set(
        algorithm
    )
    assert "synthetic" in tree["experiment"]["data"]  # quickstart's dataset is synthetic
    assert "cluster_shift" not in tree["experiment"]["data"]
    assert len(out.splitlines()) < 80
    assert "--all prints them" in out.splitlines()[-1]
    # Only default sections are dropped, so the printed YAML is the same config.
    assert config_from_dict(tree) == load_config(QUICKSTART)


def test_validate_keeps_the_block_of_the_algorithm_in_use(capsys):
    tree, _ = _printed(capsys, "--set", "algorithm.name=ali_dpfl")

    # A seed paper's options are its resolved options (defaults filled in), no other
    # paper's section is in the tree.
    algorithm = tree["experiment"]["algorithm"]
    assert algorithm["options"]["gamma"] == 10.0 and "fedfdp" not in algorithm


def test_validate_says_which_option_sections_the_algorithm_does_not_read(capsys):
    tree, out = _printed(capsys, "--set", "algorithm.fedfdp.lam=0.5")

    assert "fedfdp" not in tree["experiment"]["algorithm"]
    assert "# checked, not read by dp_fedavg (another algorithm's options): " in out
    assert "experiment.algorithm.fedfdp" in out


def test_run_says_which_option_sections_it_leaves_out_too(capsys, tmp_path):
    argv = ["run", str(QUICKSTART), "--out", str(tmp_path / "run"), "--no-progress",
            "--set", "runtime.backend=local", "--set", "algorithm.rounds=1",
            "--set", "algorithm.fedfdp.lam=0.5"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    note = "not read by dp_fedavg (another algorithm's options): experiment.algorithm.fedfdp"
    assert note in err
    assert main([*argv[:3], str(tmp_path / "plain"), *argv[4:-2]]) == 0  # nothing to say
    assert "not read by" not in capsys.readouterr().err


def test_validate_refuses_a_bad_value_in_another_algorithms_section(capsys):
    assert (
        main(["validate", str(QUICKSTART), "--no-data", "--set", "algorithm.fedfdp.lam=-1"]) == 2
    )
    assert "experiment.algorithm.fedfdp.lam" in capsys.readouterr().err


def test_validate_all_prints_every_section(capsys):
    tree, out = _printed(capsys, "--all")

    assert {"server", "options"} <= set(tree["experiment"]["algorithm"])
    assert "cluster_shift" in tree["experiment"]["data"]
    assert "not shown" not in out
