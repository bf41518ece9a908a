"""Where the DP noise comes from: the secure source (``privacy.secure_noise``) and the
counter-based CPU Gaussian samplers (``privacy.noise_sampler``, registry `noise_samplers`;
`counter_noise` is their shared stream contract, `ziggurat` and `boxmuller` the samplers,
the underscored modules their numba loops, imported on first use).
"""
