"""horovodrun's common flags on ``collectives-run``, so a horovodrun command line runs unchanged.

Each flag becomes the variable Horovod's own launcher would set for the ranks
(``collectives.torch`` reads them: see its ``_knobs``), or an ssh option;
``--gloo`` and ``--mpi`` pick Horovod's controller and are accepted and
ignored (there is one implementation). Flags collectives-run already has
under the same name (``-np``, ``-H``, ``--hostfile``, ``--network-interface``,
``--start-timeout``, ``--verbose``) keep their meaning.
"""
from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["add_arguments", "exports_from"]


def _number(lo: float, integer: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if integer else 'a number'}") from None
        if not (value >= lo and value != float("inf")):
            raise argparse.ArgumentTypeError(f"{text!r}: must be >= {lo:g}")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add horovodrun's flags to the collectives-run parser."""
    g = p.add_argument_group("horovodrun's flags")
    g.add_argument("-p", "--ssh-port", dest="ssh_port", type=_number(1, True), default=None,
                   help="ssh port of the remote hosts (horovodrun's -p)")
    g.add_argument("--fusion-threshold-mb", type=_number(0), default=None,
                   help="fusion buffer in MiB (sets HOROVOD_FUSION_THRESHOLD)")
    g.add_argument("--cycle-time-ms", type=_number(0), default=None,
                   help="negotiation cycle in ms (sets HOROVOD_CYCLE_TIME)")
    g.add_argument("--cache-capacity", type=_number(0, True), default=None,
                   help="response-cache entries (sets HOROVOD_CACHE_CAPACITY)")
    g.add_argument("--timeline-filename", default=None,
                   help="Chrome trace written by rank 0 (sets HOROVOD_TIMELINE)")
    g.add_argument("--no-stall-check", action="store_true",
                   help="no stall warnings (sets HOROVOD_STALL_CHECK_DISABLE=1)")
    g.add_argument("--stall-check-warning-time-seconds", type=_number(0), default=None,
                   help="sets HOROVOD_STALL_CHECK_TIME_SECONDS")
    g.add_argument("--stall-check-shutdown-time-seconds", type=_number(0), default=None,
                   help="sets HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    g.add_argument("--log-level", default=None,
                   choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"],
                   help="sets HOROVOD_LOG_LEVEL")
    g.add_argument("--autotune", action="store_true",
                   help="sets HOROVOD_AUTOTUNE=1: rank 0 tunes the fusion threshold and cycle "
                   "time online (Bayesian optimisation), the same values on every rank; a "
                   "threshold or cycle time given explicitly stays fixed")
    g.add_argument("--autotune-log-file", default=None,
                   help="sets HOROVOD_AUTOTUNE_LOG (rank 0 writes a CSV row per sample)")
    g.add_argument("--autotune-warmup-samples", type=_number(0, True), default=None,
                   help="sets HOROVOD_AUTOTUNE_WARMUP_SAMPLES (default 3)")
    g.add_argument("--autotune-steps-per-sample", type=_number(1, True), default=None,
                   help="sets HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE (default 10)")
    g.add_argument("--autotune-bayes-opt-max-samples", type=_number(1, True), default=None,
                   help="sets HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (default 20)")
    g.add_argument("--autotune-gaussian-process-noise", type=_number(0), default=None,
                   help="sets HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (default 0.8)")
    g.add_argument("--gloo", action="store_true", help="accepted and ignored (one controller)")
    g.add_argument("--mpi", action="store_true", help="accepted and ignored (one controller)")


def exports_from(args: argparse.Namespace) -> tuple[dict, list]:
    """(variables for every rank, extra ssh options) from horovodrun's flags."""
    env: dict = {}
    if args.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{args.cycle_time_ms:g}"
    if args.cache_capacity is not None:
        env["HOROVOD_CACHE_CAPACITY"] = str(int(args.cache_capacity))
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = args.timeline_filename
    if args.no_stall_check:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    if args.stall_check_warning_time_seconds is not None:
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = f"{args.stall_check_warning_time_seconds:g}"
    if args.stall_check_shutdown_time_seconds is not None:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = \
            f"{args.stall_check_shutdown_time_seconds:g}"
    if args.log_level:
        env["HOROVOD_LOG_LEVEL"] = args.log_level.lower()
    if args.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if args.autotune_log_file:
        env["HOROVOD_AUTOTUNE_LOG"] = args.autotune_log_file
    for flag, name in (("autotune_warmup_samples", "WARMUP_SAMPLES"),
                       ("autotune_steps_per_sample", "STEPS_PER_SAMPLE"),
                       ("autotune_bayes_opt_max_samples", "BAYES_OPT_MAX_SAMPLES")):
        if getattr(args, flag) is not None:
            env[f"HOROVOD_AUTOTUNE_{name}"] = str(int(getattr(args, flag)))
    if args.autotune_gaussian_process_noise is not None:
        env["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"] = \
            f"{args.autotune_gaussian_process_noise:g}"
    ssh = ["-p", str(int(args.ssh_port))] if args.ssh_port is not None else []
    return env, ssh
