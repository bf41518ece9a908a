"""Empirical privacy auditing in one run (Steinke, Nasr & Jagielski, NeurIPS 2023).

`run_audit(config, ...)` (also `raydpfl.run_audit`; `audit` is the same function) runs
the experiment once with canaries and returns an `AuditResult`:
the empirical ε lower bound at a stated confidence beside the accountant's ε. The bound
itself is `epsilon_lower_bound` (`raydpfl.audit.bound`); the canaries and the audited
algorithms are in `raydpfl.audit.canaries`; the modes, their threat models and which
algorithms are audited (`auditable()`, declared by each algorithm's registration:
dp_fedavg_client at the client level; dp_fedavg and every algorithm of the shared DP-SGD
loop, `loop_auditable()`, at the record level) in
`raydpfl.audit.run`. Layer 6: uses the composition root (`raydpfl.experiment`).
"""

from raydpfl.audit.bound import correct_guesses, epsilon_lower_bound, p_value
from raydpfl.audit.run import MODES, AuditResult, audit

#: The top-level name (`raydpfl.run_audit`, beside `raydpfl.run_simulation`):
#: ``raydpfl.audit`` is this package.
run_audit = audit

__all__ = [
    "MODES",
    "AuditResult",
    "audit",
    "correct_guesses",
    "epsilon_lower_bound",
    "p_value",
    "run_audit",
]
