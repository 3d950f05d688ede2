"""The server's own per-position acceptance, counted from the verdicts the host already reads
(accepted proposals and tokens verified, per request and step): no extra device work."""

from __future__ import annotations


class AcceptanceCounts:
    """How often proposal k (0..W-2) was verified with every proposal before it accepted, and
    how often it was accepted then."""

    def __init__(self, verify_width: int):
        self.verify_width = verify_width
        # [verified tokens][accepted proposals] -> request steps
        self._steps = [[0] * verify_width for _ in range(verify_width + 1)]
        self.num_steps = 0  # request steps that verified a proposal

    def observe(self, accepted: int, verified: int) -> None:
        """One request's verify step: `accepted` of its `verified - 1` verified proposals."""
        if verified > 1:
            self._steps[verified][accepted] += 1
            self.num_steps += 1

    def rates(self, prior: list[float], prior_weight: float) -> list[float]:
        """Each proposal's conditional acceptance: the counts, with `prior` `[W - 1]` worth
        `prior_weight` observations of every proposal."""
        trials, accepts = [0] * (self.verify_width - 1), [0] * (self.verify_width - 1)
        for verified, row in enumerate(self._steps):
            for accepted, n in enumerate(row):
                if not n:
                    continue
                # proposals 0..accepted were tried (within the verified ones), 0..accepted-1
                # passed
                for k in range(min(accepted + 1, verified - 1)):
                    trials[k] += n
                for k in range(accepted):
                    accepts[k] += n
        return [(prior_weight * p + a) / (prior_weight + t)
                for p, a, t in zip(prior, accepts, trials, strict=True)]
