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
from raydpfl.papers.ali_dpfl import options as ali_dpfl
from raydpfl.papers.dpfl_bcs import options as dpfl_bcs
from raydpfl.papers.fedfdp import options as fedfdp
from raydpfl.papers.rc_dpfl import options as rc_dpfl

#: Builder module of each built-in algorithm name (registered as ``"module:build"``).
_BUILDERS = {
    "raydpfl.experiment.builders.core": CORE_ALGORITHMS,
    "raydpfl.papers.ali_dpfl.builder": ali_dpfl.NAMES,
    "raydpfl.papers.fedfdp.builder": fedfdp.NAMES,
    "raydpfl.papers.dpfl_bcs.builder": dpfl_bcs.NAMES,
    "raydpfl.papers.rc_dpfl.builder": rc_dpfl.NAMES,
}

for _module, _names in _BUILDERS.items():
    for _name in _names:
        registry.register("algorithm", _name, f"{_module}:build", builtin=True)
