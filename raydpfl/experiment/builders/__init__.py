"""Per-paper builders: config section → algorithm, ledger and privacy metadata.

`raydpfl.experiment.build` dispatches on `experiment.algorithm.name`: each module here
serves the names its config section (`raydpfl.config.<paper>.NAMES`) declares, with

    build(config, dataset, model) -> (algorithm, ledger or None, privacy metadata)

so that adding a paper touches its own modules, not the core builder. Every name is
registered in `raydpfl.registry` (``builtin=True``), the one table `build` dispatches on;
a user's algorithm registers there too (`raydpfl.experiment.plugins` builds it).
"""

from raydpfl import registry
from raydpfl.config.schema import CORE_ALGORITHMS

#: Builder module of each core algorithm name (registered as ``"module:build"``); the seed
#: papers register their own names through the ``raydpfl.plugins`` entry points.
_BUILDERS = {"raydpfl.experiment.builders.core": CORE_ALGORITHMS}

#: Facts each core name declares (`raydpfl.registry.Entry.tags`).
_TAGS = {"dp_fedavg": ("audit:dp_fedavg",)}

for _module, _names in _BUILDERS.items():
    for _name in _names:
        registry.register(
            "algorithm", _name, f"{_module}:build", builtin=True, tags=_TAGS.get(_name, ())
        )
