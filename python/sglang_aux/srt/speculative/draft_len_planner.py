"""The verify width each running batch size gets (`DraftLenSchedule`): the flag's, or derived
from the step costs and the draft's acceptance so that every batch size runs at the width of
most expected tokens per second, down to plain decoding (width 1: no draft forward, the anchor
alone) where speculation does not pay.

Derivation, for each batch size bs the draft graphs cover, widths w = 1..W: expected tokens a
request emits per step E(w) = 1 + sum_{k=1}^{w-1} prod_{j<=k} a_j (a_j: proposal j's
acceptance given the ones before it were accepted), and the step's cost c_draft(bs) +
c_verify(bs * w) + bs * (c_ctx_draft + c_ctx_verify) in ms (`StepCosts`: the contexts' share
grows with the requests, not the tokens; width 1 has no draft cost); w maximizes E(w) / cost,
the smaller w on a tie. Compact verify's own budget (`VerifyPlan.budget`) caps the tokens a width
can verify: a request then verifies t = 1 + min(w - 1, budget / bs) tokens on average, and
E and the cost are taken at t (E interpolated between whole widths).

The acceptance is `--speculative-acceptance-profile`'s as a prior (else every proposal
accepted: full width until the server has seen its draft), then the server's own counts
(`AcceptanceCounts`), re-derived every REDERIVE_STEPS verify steps; a new schedule is logged.
Static verify derives only from a profile, and once: its graphs are captured at the widths
the schedule gives each batch size (`ModelRunner.capture_step_widths`), so the counts never
change it; its verify costs are its full-width graphs', a batch size's tokens read as a
token count (the tokens decide the GEMMs; the padding rows read almost no KV either way),
and its draft's at w - 1 proposals a request (`StepCosts.draft`: a narrower step's draft
computes only their logits). Without a profile it runs the full width at every batch size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from sglang_aux.srt.configs.acceptance_profile import (
    AcceptanceProfile,
    default_profile_path,
)
from sglang_aux.srt.configs.draft_len_schedule import DraftLenSchedule
from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.server_args import STATIC_COSTS_NEED_PROFILE, ServerArgs
from sglang_aux.srt.speculative.acceptance_counts import AcceptanceCounts

logger = logging.getLogger(__name__)

REDERIVE_STEPS = 256  # verify steps between two derivations from the running counts
PRIOR_WEIGHT = 64.0  # observations of each proposal the prior acceptance is worth
TIE_RTOL = 1e-9  # throughputs this close are a tie: the smaller width wins


def _expected_by_width(rates: Sequence[float]) -> list[float]:
    """`[W]`: E(1), ..., E(W)."""
    survival, total = 1.0, [1.0]
    for a in rates:
        survival *= a
        total.append(total[-1] + survival)
    return total


def expected_tokens(rates: Sequence[float], width: float,
                    total: list[float] | None = None) -> float:
    """E(width): tokens a request emits per verify step of `width` tokens, given each
    proposal's conditional acceptance `rates` `[W - 1]`; linear between whole widths.
    `total`: `_expected_by_width(rates)`, when the caller has it."""
    total = total or _expected_by_width(rates)
    lo = min(int(width), len(total))
    if lo >= width or lo == len(total):
        return total[lo - 1]
    return total[lo - 1] + (width - lo) * (total[lo] - total[lo - 1])


def derive_widths(batch_sizes: Sequence[int], costs: StepCosts, rates: Sequence[float],
                  budget: Callable[[int], int], narrow_draft: bool = False) -> dict[int, int]:
    """Each batch size's width of most expected tokens per ms (module docstring);
    `narrow_draft`: a width's draft computes only its w - 1 proposals (static verify)."""
    verify_width, total = len(rates) + 1, _expected_by_width(rates)
    widths = {}
    for bs in batch_sizes:
        best_w, best = 1, 1.0 / (costs.verify(bs) + costs.context_cost(bs, drafted=False))
        for w in range(2, verify_width + 1):
            t = 1 + min(w - 1, budget(bs) / bs)
            cost = (costs.draft(bs, w - 1 if narrow_draft else None)
                    + costs.verify(math.ceil(bs * t))
                    + costs.context_cost(bs, drafted=True))
            rate = expected_tokens(rates, t, total) / cost
            if rate > best * (1 + TIE_RTOL):
                best_w, best = w, rate
        widths[bs] = best_w
    return widths


class DraftLenPlanner:
    def __init__(self, server_args: ServerArgs, verify_width: int, compact: bool,
                 draft_dir: str = ""):
        """Validates the flags against the draft in `draft_dir` (before any model loads)."""
        self.verify_width, self.compact = verify_width, compact
        flag = server_args.speculative_draft_len_schedule
        self.fixed = DraftLenSchedule.parse(flag) if flag is not None else None
        if self.fixed is not None:
            self.fixed.check(verify_width)
        value = server_args.speculative_acceptance_profile
        path = default_profile_path(value, draft_dir)
        try:
            self.profile = None if path is None else AcceptanceProfile.load(path, verify_width)
        except ValueError as e:
            if value is not None:
                raise
            # the draft's own, which nobody asked for: a server that does not fit it still runs
            logger.warning("%s: not used (the draft's own profile, taken by default; "
                           "--speculative-acceptance-profile FILE or none chooses)", e)
            self.profile = None
        self.step_costs_path = server_args.speculative_step_costs
        if self.step_costs_path and not compact and self.profile is None:
            raise ValueError(STATIC_COSTS_NEED_PROFILE)
        self.schedule = self.fixed or DraftLenSchedule.uniform(verify_width)
        self.source = "flag" if self.fixed is not None else "static verify: full width"
        self.costs: StepCosts | None = None
        self.batch_sizes: list[int] = []
        self.budget: Callable[[int], int] | None = None
        self.counts = AcceptanceCounts(verify_width)
        self.verify_steps = 0
        self.plain_steps = 0

    @property
    def derived(self) -> bool:
        return self.fixed is None and (self.compact or self.profile is not None)

    def start(self, batch_sizes: Sequence[int], budget: Callable[[int], int],
              measure: Callable[[], StepCosts | None]) -> None:
        """After graph capture: the first schedule, for `batch_sizes` (the draft graphs'),
        from the costs file or `measure()` (None: no graphs to time)."""
        if self.derived:
            self.costs = (StepCosts.load(self.step_costs_path) if self.step_costs_path
                          else measure())
            self.budget = budget
            # without draft graphs: the sizes the costs were measured at
            sizes = batch_sizes or ([] if self.costs is None else self.costs.draft_ms)
            self.batch_sizes = sorted({1, *sizes})
            if self.costs is None:
                self.source = "no step costs (no graphs to time, no --speculative-step-costs)"
            else:
                self.source = "derived"
                self.schedule = self._derive()
        logger.info("Draft length schedule (%s): %s", self.source, self.schedule)

    def prior(self) -> list[float]:
        if self.profile is None:
            return [1.0] * (self.verify_width - 1)
        return self.profile.conditional_rates()

    def rates(self) -> list[float]:
        return self.counts.rates(self.prior(), PRIOR_WEIGHT)

    def _derive(self) -> DraftLenSchedule:
        return DraftLenSchedule.of_widths(derive_widths(
            self.batch_sizes, self.costs, self.rates(), self.budget,
            narrow_draft=not self.compact))

    def width(self, bs: int) -> int:
        return self.schedule.width(bs)

    def observe(self, accepted: int, verified: int) -> None:
        """One request's verdict, as the host reads it."""
        self.counts.observe(accepted, verified)

    def count_step(self, width: int) -> None:
        """A verify step launched at `width`; every REDERIVE_STEPS, derive again."""
        self.verify_steps += 1
        self.plain_steps += width == 1
        if (self.source == "derived" and self.compact
                and self.verify_steps % REDERIVE_STEPS == 0):
            schedule = self._derive()
            if schedule != self.schedule:
                logger.info("Draft length schedule after %d verify steps: %s",
                            self.verify_steps, schedule)
                self.schedule = schedule

    def info(self) -> dict:
        """What /get_server_info shows: the schedule in force and where it came from."""
        info = {"schedule": str(self.schedule), "source": self.source,
                "verify_width": self.verify_width}
        if self.source == "derived":
            info |= {"step_costs": self.costs.source,
                     "acceptance_prior": self.profile.path if self.profile else
                     "none (every proposal accepted)",
                     "acceptance_observed_steps": self.counts.num_steps,
                     "rederived": f"every {REDERIVE_STEPS} verify steps" if self.compact
                     else "never (static verify's graphs are captured for it)",
                     "acceptance_rates": [round(a, 4) for a in self.rates()]}
        return info
