"""What a release costs: the accountants, calibration (`calibration` for the subsampled
Gaussian, `single_release` for one Gaussian or Laplace release), the record-level ledger
(`ledger`, `ledger_stats`), client-level accounting (`client_level`), step budgets
(`step_budget`) and the declared privacy plan (`plan`).
"""
