"""Bad config files: `validate` and `run` refuse each with the same single line (exit 2),
before anything is written; a fuzz over the loader finds nothing but Config or ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raydpfl.cli.main import main
from raydpfl.config import ConfigError, load_config

LOCAL = "runtime: {backend: local, progress: false}\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)

BAD: dict[str, tuple[bytes, str]] = {
    "infinite epsilon": (
        b"experiment:\n  privacy: {epsilon: .inf}\n" + LOCAL.encode(),
        "experiment.privacy.epsilon: must be a finite number, got inf",
    ),
    "nan clip norm": (
        b"experiment:\n  privacy: {clip_norm: .nan}\n" + LOCAL.encode(),
        "experiment.privacy.clip_norm: must be a finite number, got nan",
    ),
    "absurd client count": (
        b"experiment:\n  data: {num_clients: 1.0e+11}\n" + LOCAL.encode(),
        "experiment.data.num_clients: must be at most 2147483647 in size",
    ),
    "more clients than one machine": (
        b"experiment:\n  data: {num_clients: 20000000}\n" + LOCAL.encode(),
        "experiment.data.num_clients: must be <= 10,000,000",
    ),
    "invalid utf-8": (b'experiment:\n  name: "\xff\xfe"\n', "not UTF-8 text (byte 0xff at offset"),
    "recursive alias": (b"experiment: &x\n  name: [*x]\n", "a YAML alias refers to itself"),
    "alias bomb": (BOMB.encode(), "expands to more than 100000 values"),
    "duplicate key": (
        b"experiment:\n  name: a\n  name: b\n" + LOCAL.encode(),
        "duplicate key 'name' at line 3 (first at line 2)",
    ),
    "empty file": (b"", "is empty: expected a mapping with keys experiment, runtime"),
    "only comments": (b"# nothing\n", "is empty: expected a mapping"),
    "unaffordable budget": (
        b"experiment:\n  privacy: {epsilon: 0.001}\n" + LOCAL.encode(),
        "experiment.privacy.epsilon: 0.001 cannot pay for one round: one round of DP-SGD "
        "(sigma=1, q=0.05, 5 local steps) costs epsilon=1.932 at delta=1e-05 (rdp)",
    ),
    "vanishing noise multiplier": (
        b"experiment:\n  privacy: {noise_multiplier: 1.0e-300}\n" + LOCAL.encode(),
        "experiment.privacy.noise_multiplier: must be in [0.01, 1e+06] or null (calibrate), "
        "got 1e-300",
    ),
    "vanishing sampling rate": (
        b"experiment:\n  privacy: {sampling_rate: 1.0e-300}\n" + LOCAL.encode(),
        "experiment.privacy.sampling_rate: must be in [1e-06, 1], got 1e-300",
    ),
    "oversized file": (
        b"experiment: {name: big}\n" + b"#" * (8 * 1024 * 1024) + b"\n",
        "larger than a config file may be (more than 8,388,608 bytes, 8 MiB); not parsed",
    ),
    "missing dataset files": (
        b"experiment:\n  data: {dataset: mnist, root: /nonexistent-raydpfl}\n" + LOCAL.encode(),
        "mnist: files not found under /nonexistent-raydpfl",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_validate_and_run_refuse_a_bad_config_with_the_same_line(case, tmp_path, capsys):
    content, expected = BAD[case]
    config = tmp_path / "bad.yaml"
    config.write_bytes(content)
    out = tmp_path / "run"

    assert main(["validate", str(config)]) == 2
    validate_err = capsys.readouterr().err.strip().splitlines()
    assert main(["run", str(config), "--out", str(out), "--no-progress"]) == 2
    run_err = capsys.readouterr().err.strip().splitlines()

    assert len(validate_err) == 1 and validate_err == run_err, (validate_err, run_err)
    assert validate_err[0].startswith("raydpfl: error: ")
    assert expected in validate_err[0]
    assert not out.exists()  # nothing written


def test_anchors_and_merge_keys_still_work(tmp_path):
    config = tmp_path / "merge.yaml"
    config.write_text(
        "base: &privacy {epsilon: 3.0, delta: 1.0e-5}\n"
        "experiment:\n  privacy:\n    <<: *privacy\n    clip_norm: 2.0\n"
        "runtime: {backend: local}\n"
    )
    with pytest.raises(ConfigError, match=r"^base: unknown key"):  # merged, then strict
        load_config(config)
    config.write_text(
        "experiment:\n  privacy: &p {epsilon: 3.0, delta: 1.0e-5}\n"
        "  name: merged\nruntime: {backend: local}\n"
    )
    assert load_config(config).experiment.privacy.epsilon == 3.0


def test_an_override_cannot_sneak_in_a_non_finite_value(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text(LOCAL)
    with pytest.raises(ConfigError, match=r"^experiment\.privacy\.delta: must be a finite"):
        load_config(config, ["privacy.delta=.nan"])


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.text(
            alphabet=st.sampled_from(list("{}[]:&*!-,#'\" \n\tabexprimntdlsuo0123.e")),
            max_size=200,
        ).map(str.encode),
    )
)
def test_the_loader_returns_a_config_or_one_config_error(tmp_path, data):
    path: Path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as e:
        assert "\n" not in str(e).strip()
