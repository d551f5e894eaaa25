"""A small deterministic training for tests/test_torch_elastic.py (run by collectives-run).

The data of step s on rank r of a world of n ranks is drawn from a generator seeded
with (s, r, n), so a run that rolled back to the wrong commit, re-ran or skipped a
step, or did not re-number the ranks ends with another model. Every event is one
JSON line on stdout: start (each call of the training function: step, rank, size),
first_step (when its first step has completed), kill, hosts_updated, done (the final
parameters).

Knobs (environment): TOTAL_STEPS, COMMIT_EVERY, KILL_AT ("<worker id>:<step>[,...]": that
worker SIGKILLs itself before the step), STEP_SLEEP (seconds per step), OUT_DIR (rank 0
saves each commit as <step>.pt there), START_FROM (a commit file to start from: the
reference run), UNTIL_SIZE (go on past TOTAL_STEPS until the world has this size, then
EXTRA_STEPS more),
HOSTS_FILE + ADD_HOST_AT ("<step>:<line>": rank 0 appends the line at that step) or
SET_HOSTS_AT ("<step>:<lines separated by |>": rank 0 rewrites the file).
"""
import json
import os
import signal
import sys
import time

import torch

import collectives.torch as hvd
from _elastic_data import batch

TOTAL = int(os.environ.get("TOTAL_STEPS", "30"))
EVERY = int(os.environ.get("COMMIT_EVERY", "5"))
SLEEP = float(os.environ.get("STEP_SLEEP", "0"))
UNTIL_SIZE = int(os.environ.get("UNTIL_SIZE", "0"))
EXTRA = int(os.environ.get("EXTRA_STEPS", "5"))
OUT_DIR = os.environ.get("OUT_DIR", "")
WID = os.environ.get("COLLECTIVES_ELASTIC_ID", "-")
KILLS = {tuple(item.split(":")) for item in os.environ.get("KILL_AT", "").split(",") if item}
add_step, _, add_line = os.environ.get("ADD_HOST_AT", "-1:").partition(":")
set_step, _, set_text = os.environ.get("SET_HOSTS_AT", "-1:").partition(":")


def event(kind, **fields):
    fields.update(ev=kind, id=WID, pid=os.getpid(), t=time.time())
    print(json.dumps(fields), flush=True)


hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1, dtype=torch.float64)
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
step0 = 0
if os.environ.get("START_FROM"):
    saved = torch.load(os.environ["START_FROM"])
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    step0 = saved["step"]
state = hvd.elastic.TorchState(model, opt, step=step0)


@hvd.elastic.run
def train(state):
    event("start", step=state.step, rank=hvd.rank(), size=hvd.size())
    first = True
    # at the size wanted, a few more steps (the same bound on every rank: state.step is synced)
    end = max(TOTAL, state.step + EXTRA) if UNTIL_SIZE == hvd.size() else TOTAL
    while state.step < end or (UNTIL_SIZE and hvd.size() != UNTIL_SIZE):
        if state.step > 50 * TOTAL:
            sys.exit("UNTIL_SIZE never reached")
        if (WID, str(state.step)) in KILLS:
            event("kill", step=state.step, rank=hvd.rank())
            os.kill(os.getpid(), signal.SIGKILL)
        if hvd.rank() == 0 and state.step == int(add_step):
            with open(os.environ["HOSTS_FILE"], "a") as fh:
                fh.write(add_line + "\n")
        if hvd.rank() == 0 and state.step == int(set_step):
            with open(os.environ["HOSTS_FILE"], "w") as fh:
                fh.write(set_text.replace("|", "\n") + "\n")
        x, y = batch(state.step, hvd.rank(), hvd.size())
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        for i, p in enumerate(model.parameters()):
            hvd.allreduce_(p.grad, op=hvd.Average, name=f"grad.{i}")
        opt.step()
        state.step += 1
        if first:
            event("first_step", step=state.step, rank=hvd.rank(), size=hvd.size())
            first = False
        if SLEEP:
            time.sleep(SLEEP)
        if state.step % EVERY == 0:
            if hvd.rank() == 0 and OUT_DIR:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "step": state.step}, os.path.join(OUT_DIR, f"{state.step}.pt"))
            try:
                state.commit()
            except hvd.HostsUpdatedInterrupt as exc:
                event("hosts_updated", step=state.step, skip_sync=exc.skip_sync)
                raise


train(state)
event("done", step=state.step, rank=hvd.rank(), size=hvd.size(),
      params=[p.detach().flatten().tolist() for p in model.parameters()])
hvd.shutdown()
