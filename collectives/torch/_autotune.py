"""Horovod's autotuner (``HOROVOD_AUTOTUNE=1``): fusion threshold and cycle time tuned online.

Rank 0 scores the job as Horovod's ``ParameterManager`` does: bytes
allreduced per second over the ops the negotiation runs (``_negotiate``).
A *sample* is five windows of ``HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE`` steps
each, scored by the median of the five. Steps are counted by name, as
Horovod counts them: a window ends when some op name has run that many more
times (so ops left unnamed, numbered per call, never end one;
``DistributedOptimizer`` names its buckets). The first ``HOROVOD_AUTOTUNE_WARMUP_SAMPLES``
samples are discarded. Horovod's four first points (fusion MiB, cycle ms) =
(4, 5), (32, 50), (16, 25), (8, 10) come next, then points proposed by
Bayesian optimisation (``_bayes``) over fusion 0-64 MiB and cycle 1-100 ms,
up to ``HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES`` + 1 scored samples; then
the best point is fixed for the rest of the job. A fusion threshold or
cycle time set explicitly (``HOROVOD_FUSION_THRESHOLD``,
``COLLECTIVES_FUSION_THRESHOLD``, ``HOROVOD_CYCLE_TIME``, or the launcher's
flags for them) is held at its value and left out of the search, as in
Horovod. ``HOROVOD_AUTOTUNE_LOG``: rank 0 writes Horovod's CSV, one row per
scored sample and a last row with the best point.

How every rank uses the same values at the same point: rank 0 never changes
its own parameters. It announces each point as a ``tune`` record of the
negotiation (``[TUNE, fusion bytes, cycle ms, tuning]``, with the explicitly
set values in their places), which forces that round's record exchange;
every rank applies rank 0's records in the same round, before that round's
ops run (``apply_record``), so every rank fuses the round's ops with the
same threshold. A record from another rank is ignored, and one whose values
are out of bounds fails the negotiation on every rank (``LayoutMismatch``).
Every rank keeps the sequence applied, with its round number, in
``Negotiator.tuned``. Only the world's negotiation is tuned (process sets
share its rounds); ``DistributedOptimizer``'s buckets keep the layout
agreed when it was built.
"""
from __future__ import annotations

import logging
import math
import statistics
from typing import Any, Optional

import numpy as np

from . import _knobs
from ._bayes import BayesianOptimizer
from ._knobs import Settings
from .exceptions import LayoutMismatch

__all__ = ["TUNE", "Autotuner", "attach", "apply_record"]

log = logging.getLogger("collectives.torch")

TUNE = "tune"  # the negotiation record's kind
MIB = 1 << 20
BOUNDS = ((0.0, 64.0), (1.0, 100.0))  # fusion threshold MiB, cycle time ms: Horovod's
FIRST_POINTS = ((4.0, 5.0), (32.0, 50.0), (16.0, 25.0), (8.0, 10.0))  # Horovod's
WINDOWS = 5  # scores per sample, of which the median counts (Horovod's SAMPLES)
MAX_FUSION_BYTES = 1 << 40  # bounds on a record's values (they come from a peer)
MAX_CYCLE_MS = 10_000.0
LOG_HEADER = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
              "cycle_time_ms,tensor_fusion_threshold,score")  # Horovod's columns
_WIDTH = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8}  # _plan's dtype codes -> bytes


def _allreduce_bytes(plan: int) -> int:
    """Bytes of the allreduce an op's plan describes (0: not an allreduce; see _plan)."""
    if not plan:
        return 0
    return ((plan >> 12) & ((1 << 48) - 1)) * _WIDTH.get((plan >> 4) & 0xFF, 8)


class Autotuner:
    """Rank 0's parameter manager: scores samples, picks the next point, logs.

    Args:
        settings: warm-up samples, steps per sample, samples, noise, log path.
        fusion_bytes, cycle_ms: the values in use; those marked fixed stay.
        fixed_fusion, fixed_cycle: set explicitly (not tuned).
        columns: the values of Horovod's categorical log columns (hierarchical
            allreduce, hierarchical allgather, torus allreduce, cache enabled), as
            in effect here (none of them is tuned).
        seed: seeds the optimiser's candidate draws.
    """

    def __init__(self, settings: Settings, fusion_bytes: int, cycle_ms: float,
                 fixed_fusion: bool, fixed_cycle: bool, columns: tuple = (0, 0, 0, 1),
                 seed: int = 0) -> None:
        self.settings = settings
        self.columns = columns
        self.free = [i for i, fixed in enumerate((fixed_fusion, fixed_cycle)) if not fixed]
        if not self.free:
            raise ValueError("autotune: fusion threshold and cycle time are both set "
                             "explicitly; nothing to tune")
        self.values = [fusion_bytes / MIB, float(cycle_ms)]  # MiB, ms: the point in force
        self.opt = BayesianOptimizer([BOUNDS[i] for i in self.free], settings.noise, seed)
        self.firsts = [np.array([p[i] for i in self.free]) for p in FIRST_POINTS]
        self.warmups_left = settings.warmups
        self.scored = 0
        self.active = True
        self.best: Optional[tuple] = None  # (MiB, ms, score) once done
        self.history: list = []  # (MiB, ms, score) per scored sample
        self._pending: Optional[list] = None
        self._start: Optional[float] = None  # the window's start; None: a record is pending
        self._counts: dict = {}
        self._bytes = 0
        self._scores: list = []
        self._open_log()
        self._propose(self.firsts[0])

    # -- the negotiation's side -------------------------------------------------
    def records(self) -> list:
        """The records rank 0 announces this round (the next point, once)."""
        if self._pending is None:
            return []
        rec, self._pending = self._pending, None
        return [rec]

    def applied(self, now: float) -> None:
        """Rank 0's record was applied (this round, on every rank): measure from now."""
        if self.active:
            self._reset(now)

    def observe(self, plan: list, now: float) -> None:
        """Count a round's ops: plan is _negotiate's [(key, allreduce plan, error, ...)]."""
        if not self.active or self._start is None:
            return
        done = [(key, aplan) for key, aplan, error, *_ in plan if error is None]
        due = (len(self._scores) + 1) * self.settings.steps_per_sample
        ended = False
        for key, _ in done:
            seen = self._counts.get(key, 0)
            self._counts[key] = seen + 1
            ended = ended or seen >= due  # a name starts its next step: the window ends
        if ended:  # (this round's bytes count in the next window: they start it)
            self._scores.append(self._bytes / max(now - self._window, 1e-9))
            self._bytes, self._window = 0, now
        self._bytes += sum(_allreduce_bytes(aplan) for _, aplan in done)
        if len(self._scores) >= WINDOWS:
            self._tune(statistics.median(self._scores), now)

    # -- the tuning ---------------------------------------------------------------
    def _reset(self, now: float) -> None:
        self._start = self._window = now
        self._counts, self._bytes, self._scores = {}, 0, []

    def _tune(self, score: float, now: float) -> None:
        if self.warmups_left > 0:  # discarded; the same point again
            self.warmups_left -= 1
            log.info("collectives.torch: autotune: warming up (%d left)", self.warmups_left)
            self._reset(now)
            return
        point = np.array([self.values[i] for i in self.free])
        self._log(self.values, score)
        self.history.append((self.values[0], self.values[1], score))
        self.opt.add(point, score)
        self.scored += 1
        if self.scored > self.settings.max_samples:
            best, best_score = self.opt.best()
            self.active = False
            self._propose(best)
            self.best = (self.values[0], self.values[1], best_score)
            self._log(self.values, best_score)
            log.info("collectives.torch: autotune: done; fusion threshold %.2f MiB, cycle "
                     "time %.2f ms", self.values[0], self.values[1])
        elif self.scored < len(self.firsts):
            self._propose(self.firsts[self.scored])
        else:
            self._propose(self.opt.propose())

    def _propose(self, point: np.ndarray) -> None:
        """Make `point` (the free dimensions) the next record; measure once applied."""
        for i, v in zip(self.free, point):
            self.values[i] = float(v)
        fusion = int(round(self.values[0] * MIB))
        # what every rank applies is what rank 0 logs: whole bytes, 1e-4 ms
        self.values = [fusion / MIB, round(self.values[1], 4)]
        self._pending = [TUNE, fusion, self.values[1], 1 if self.active else 0]
        self._start = None

    # -- the log ------------------------------------------------------------------
    def _open_log(self) -> None:
        path = self.settings.log_path
        if not path:
            return
        try:
            with open(path, "w") as f:
                f.write(LOG_HEADER + "\n")
        except OSError as e:
            log.warning("collectives.torch: autotune: cannot write HOROVOD_AUTOTUNE_LOG=%r "
                        "(%s); tuning without a log", path, e)
            self.settings = self.settings._replace(log_path="")

    def _log(self, values: list, score: float) -> None:
        log.info("collectives.torch: autotune: fusion threshold %.2f MiB, cycle time %.2f ms: "
                 "%.4g bytes/s", values[0], values[1], score)
        if not self.settings.log_path:
            return
        row = [*map(str, self.columns), f"{values[1]:g}", f"{values[0]:g}", f"{score:.6g}"]
        try:
            with open(self.settings.log_path, "a") as f:
                f.write(",".join(row) + "\n")
        except OSError as e:
            log.warning("collectives.torch: autotune: HOROVOD_AUTOTUNE_LOG: %s", e)


def apply_record(lane: Any, rec: list, round_no: int, now: float) -> None:
    """Apply rank 0's tune record on this rank (every rank in round `round_no`, started at
    `now`, before its ops run); LayoutMismatch if its values are not a record's."""
    try:
        fusion, cycle_ms, tuning = int(rec[1]), float(rec[2]), int(rec[3])
    except (IndexError, TypeError, ValueError):
        raise LayoutMismatch(f"negotiation: rank 0 sent a malformed {TUNE} record") from None
    if not (0 <= fusion <= MAX_FUSION_BYTES and math.isfinite(cycle_ms) and
            0.0 <= cycle_ms <= MAX_CYCLE_MS and tuning in (0, 1)):
        raise LayoutMismatch(f"negotiation: rank 0 sent a {TUNE} record out of bounds "
                             f"(fusion {fusion} bytes, cycle {cycle_ms} ms)")
    lane.fusion_bytes = fusion
    lane.cycle_s = cycle_ms / 1000.0
    lane.tuned.append((round_no, fusion, cycle_ms, bool(tuning)))
    if lane.tuner is not None:
        lane.tuner.applied(now)


def attach(lane: Any, rank: int, size: int) -> None:
    """With HOROVOD_AUTOTUNE=1 and more than one rank, give rank 0's negotiation (`lane`)
    an Autotuner (the other ranks follow its records)."""
    if not _knobs.autotune() or size < 2 or rank != 0:
        return
    fixed_fusion = _knobs.explicit("HOROVOD_FUSION_THRESHOLD")
    fixed_cycle = _knobs.explicit("HOROVOD_CYCLE_TIME")
    if fixed_fusion and fixed_cycle:
        log.warning("collectives.torch: HOROVOD_AUTOTUNE=1, but the fusion threshold and the "
                    "cycle time are both set explicitly: nothing to tune")
        return
    columns = (int(_knobs.flag("HOROVOD_HIERARCHICAL_ALLREDUCE")),
               int(_knobs.flag("HOROVOD_HIERARCHICAL_ALLGATHER")), 0,
               int(_knobs.cache_capacity() > 0))
    lane.tuner = Autotuner(_knobs.autotune_settings(), lane.fusion_bytes,
                           _knobs.cycle_time_s() * 1000.0, fixed_fusion, fixed_cycle, columns)
