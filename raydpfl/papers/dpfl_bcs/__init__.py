"""dpfl_bcs."""
