"""Privacy (no Ray), a room per concern: `mechanisms` (the kernel), `per_sample` (DP-SGD
and its engines), `noise` (the noise sources) and `accounting` (accountants,
calibration, ledgers)."""
