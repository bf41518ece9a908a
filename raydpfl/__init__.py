"""raydpfl: a Ray-based, scalable simulator for differentially-private federated learning.

The public entry points are the command line (`raydpfl run CONFIG`) and
`raydpfl.config.load_config` + `raydpfl.simulation.build.build_experiment` /
`run_experiment`. Importing the package never imports Ray.
"""

__version__ = "0.1.0"
