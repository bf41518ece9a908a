"""The seed papers as plug-ins: one folder per paper (ALI-DPFL, FedFDP, DPFL-BCS, RC-DPFL),
each holding its algorithm(s), theory, baselines, options, builder, models and README,
built on the core kit (`raydpfl.algorithms`, `raydpfl.privacy`, ...) the way a user's own
algorithm is. No paper imports another; the core imports no paper.
"""
