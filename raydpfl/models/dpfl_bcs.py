"""Models of the dpfl_bcs paper (registered in the zoo; see `raydpfl.config.dpfl_bcs`)."""

from __future__ import annotations
