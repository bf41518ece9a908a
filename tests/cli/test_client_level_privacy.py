"""`raydpfl privacy client-epsilon | client-noise | client-rounds`: the client-level
calculator agrees with the accounting the runs use, for both sampling schemes."""

from __future__ import annotations

import re

import pytest

from raydpfl.cli.main import main
from raydpfl.privacy.accounting.client_level import (
    ClientLevelCost,
    client_level_epsilon,
    client_level_max_rounds,
    client_level_noise_multiplier,
)

SCHEMES = {
    "poisson": (["--q", "0.05"], ClientLevelCost(0.0, "poisson", 200, sampling_rate=0.05)),
    "fixed": (
        ["--sampling", "fixed", "--cohort", "10"],
        ClientLevelCost(0.0, "fixed", 200, cohort_size=10),
    ),
}


def _number(out: str, name: str) -> float:
    match = re.search(rf"{name} = ([0-9.e+-]+|inf)", out)
    assert match, out
    return float(match.group(1))


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_client_epsilon_noise_and_rounds(scheme, capsys):
    flags, template = SCHEMES[scheme]
    common = ["--population", "200", *flags, "--delta", "1e-5"]
    assert main(["privacy", "client-epsilon", "--sigma", "2", "--rounds", "30", *common]) == 0
    out = capsys.readouterr().out
    assert "at the client level" in out
    expected = client_level_epsilon(
        [template.__class__(2.0, scheme, 200, template.sampling_rate, template.cohort_size, 30)],
        1e-5,
    )
    assert _number(out, "epsilon") == pytest.approx(expected, rel=1e-5)

    assert main(["privacy", "client-noise", "--epsilon", "4", "--rounds", "30", *common]) == 0
    sigma = _number(capsys.readouterr().out, "noise_multiplier")
    assert sigma == pytest.approx(client_level_noise_multiplier(4.0, 1e-5, template, 30), rel=1e-5)

    assert main(["privacy", "client-rounds", "--epsilon", "4", "--sigma", "2", *common]) == 0
    rounds = _number(capsys.readouterr().out, "rounds")
    one = template.__class__(2.0, scheme, 200, template.sampling_rate, template.cohort_size)
    assert rounds == client_level_max_rounds(4.0, 1e-5, one)


@pytest.mark.parametrize(
    "flags,field",
    [
        (["--sampling", "fixed", "--cohort", "300"], "--cohort"),
        (["--sampling", "fixed", "--q", "0.1"], "--cohort"),
        (["--cohort", "5"], "--q"),
        (["--sampling", "fixed", "--cohort", "5", "--accountant", "pld"], "--accountant"),
    ],
)
def test_bad_client_level_flags_are_one_line(flags, field, capsys):
    argv = ["privacy", "client-epsilon", "--sigma", "1", "--rounds", "3", "--population", "200"]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
