"""The privacy kernel's mechanisms: the releases that own their noise and their charge.

`kernel` (record level: mechanisms, sessions, receipts), `client_level_mechanisms`
(population level: the round's `PopulationSession`) and `loss_query` (the noisy mean-loss
query a live subsampled Gaussian answers).
"""
