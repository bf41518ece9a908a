"""ali_dpfl."""
