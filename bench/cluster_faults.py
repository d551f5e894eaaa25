"""Cluster faults, repeated: the README's reliability table (issue 37, section 1).

    sudo python bench/cluster_faults.py --trials 3            # every fault x shape
    sudo python bench/cluster_faults.py --faults kill,down --shapes 2x2,3x2 --trials 5

Each trial builds H network namespaces as hosts (tests/_netns.py), runs H x L
ranks streaming verified allreduces (8 B to 16 MiB, every algorithm, flat and
two-level) and injects one fault at a seeded random moment (tests/_faults.py).
Per (fault, shape) it prints: trials, survivor-trials that raised, named the
lost host and its ranks, hung, wrong results, and the survivors' time to error
after the fault (median and max of each trial's slowest survivor). A blip
(link down for a second) and a crawl (1 Mbit/s) are not losses: for them the
table counts streams that completed and calls that timed out.
Needs root (namespaces); run from the checkout with the package built or
installed.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from _faults import FAULTS, run_trial, summarize  # noqa: E402


def _shape(text: str) -> list:
    hosts, _, per = text.partition("x")
    return [int(per)] * int(hosts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--shapes", default="2x2,3x2,2x4", help="hosts x ranks per host, comma-separated")
    p.add_argument("--placements", default="block,cyclic")
    p.add_argument("--trials", type=int, default=2, help="seeded trials per fault, shape, placement")
    p.add_argument("--timeout", type=float, default=4.0, help="COLLECTIVES_TIMEOUT of the ranks")
    args = p.parse_args()
    print(f"| fault | hosts x ranks | trials | survivors raised | named right | hung | wrong "
          f"| time to error, s (median / max) |")
    print("|---|---|---|---|---|---|---|---|")
    seed = 0
    for fault in args.faults.split(","):
        for shape in args.shapes.split(","):
            rows, times, completed, timed_out = [], [], 0, 0
            for placement in args.placements.split(","):
                for _ in range(args.trials):
                    seed += 1
                    t = run_trial(fault, _shape(shape), placement, seed, timeout=args.timeout)
                    s = summarize(t)
                    rows.append(s)
                    if s["max_s"] is not None:
                        times.append(s["max_s"])
                    completed += sum("completed" in t.records[q] for q in t.records)
                    timed_out += sum("timed out" in t.records[q].get("raised", {}).get(
                        "message", "") for q in t.records)
            surv = sum(r["survivors"] for r in rows)
            raised = f"{sum(r['raised'] for r in rows)} of {surv}"
            if fault in ("blip", "crawl"):
                raised += f" (completed {completed}, timed out {timed_out})"
            named = f"{sum(r['named'] for r in rows)}" if fault not in ("blip", "crawl") else "-"
            tt = (f"{statistics.median(times):.2f} / {max(times):.2f}" if times else "-")
            print(f"| {fault} | {shape} | {len(rows)} | {raised} | {named} | "
                  f"{sum(r['hung'] for r in rows)} | {sum(r['wrong'] for r in rows)} | {tt} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
