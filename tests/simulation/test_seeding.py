import subprocess
import sys

from raydpfl.simulation.seeding import SERVER, derive_seed, numpy_rng, torch_generator


def test_streams_are_distinct_per_component():
    base = derive_seed(0, 1, 2, "train")

    others = {
        derive_seed(1, 1, 2, "train"),
        derive_seed(0, 2, 2, "train"),
        derive_seed(0, 1, 3, "train"),
        derive_seed(0, 1, 2, "select"),
        derive_seed(0, 1, SERVER, "train"),
    }

    assert base not in others
    assert len(others) == 5
    assert 0 <= base < 2**63


def test_streams_are_stable_across_processes():
    code = (
        "from raydpfl.simulation.seeding import derive_seed; print(derive_seed(7, 3, 11, 'train'))"
    )

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert int(out.stdout) == derive_seed(7, 3, 11, "train")


def test_generators_reproduce_their_draws():
    a = numpy_rng(0, 0, 0, "x").random(3)
    b = numpy_rng(0, 0, 0, "x").random(3)
    ta = torch_generator(0, 0, 0, "x")
    tb = torch_generator(0, 0, 0, "x")

    assert (a == b).all()
    assert __import__("torch").equal(
        __import__("torch").rand(4, generator=ta), __import__("torch").rand(4, generator=tb)
    )
