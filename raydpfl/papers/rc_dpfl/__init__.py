"""rc_dpfl."""
