"""Privacy: DP-SGD primitives, accountants, calibration and the per-client ledger (no Ray)."""
