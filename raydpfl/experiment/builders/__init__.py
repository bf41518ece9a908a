"""Per-paper builders: config section → algorithm, ledger and privacy metadata.

`raydpfl.experiment.build` dispatches on `experiment.algorithm.name`: each module here
serves the names its config section (`raydpfl.config.<paper>.NAMES`) declares, with

    build(config, dataset, model) -> (algorithm, ledger or None, privacy metadata)

so that adding a paper touches its own modules, not the core builder.
"""
