"""Models of the rc_dpfl paper (registered in the zoo; see `raydpfl.config.rc_dpfl`)."""

from __future__ import annotations
