"""Horovod's elastic API under collectives-run --elastic (collectives.torch.elastic,
collectives/elastic/worker.py, collectives/launcher/elastic_driver.py).

Each test runs tests/_elastic_train.py (a deterministic toy training, see there) under the
real launcher: real processes, real sockets, a worker SIGKILLed mid-epoch or a host added
by the discovery script. Every worker reports its pid; the test checks that none outlives
the launcher.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from conftest import RUN_CWD, TESTS, base_env  # noqa: E402

pytestmark = pytest.mark.timeout(150)

TRAIN = str(TESTS / "_elastic_train.py")


class Job:
    """A finished launcher run: exit code, output, and the workers' JSON events."""

    def __init__(self, rc, text):
        self.rc = rc
        self.text = text
        self.events = []
        for line in text.splitlines():
            head, sep, rest = line.partition("<stdout>:")
            if sep and rest.startswith("{"):
                self.events.append(json.loads(rest))

    def of(self, kind, **match):
        """The events of a kind (and field values), in output order."""
        return [e for e in self.events if e["ev"] == kind
                and all(e.get(k) == v for k, v in match.items())]

    def tail(self):
        return self.text[-6000:]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def launch(args, env, timeout=110, script=TRAIN, script_args=()):
    """collectives-run with args + the toy training (or script); returns a Job once every
    process ended (on a timeout the launcher is told to stop its workers first)."""
    cmd = [sys.executable, "-m", "collectives.run", *args, sys.executable, str(script),
           *script_args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, env=base_env(env), cwd=str(RUN_CWD),
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)  # the launcher stops its workers
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        job = Job(None, out.decode(errors="replace"))
        _end(job)
        pytest.fail("the elastic job did not end in time:\n" + job.tail())
    job = Job(p.returncode, out.decode(errors="replace"))
    assert not _end(job), "workers outlived the launcher:\n" + job.tail()
    return job


def _end(job):
    """Kill any worker still running (there should be none); return their pids."""
    pids = {e["pid"] for e in job.events}
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _final_params(job, size):
    done = job.of("done")
    assert len(done) == size and {e["size"] for e in done} == {size}, job.tail()
    params = _flat(done[0]["params"])
    for e in done[1:]:  # every rank ends with the same model
        assert _flat(e["params"]) == pytest.approx(params, abs=1e-12), job.tail()
    return params


def _flat(params):
    return [x for p in params for x in p]


def test_killed_worker_survivors_roll_back_reform_at_3_and_match_a_3_worker_run(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    victim, step = rng.randrange(4), rng.randrange(6, 27)  # mid-epoch, after the first commit
    out = tmp_path / "commits"
    out.mkdir()
    job = launch(["--elastic", "-np", "4", "--min-np", "2", "--max-np", "4"],
                 {"OUT_DIR": out, "KILL_AT": f"{victim}:{step}", "TOTAL_STEPS": 30})
    why = f"(seed {seed}: worker {victim} killed at step {step})\n" + job.tail()
    assert job.rc == 0, why
    assert len(job.of("kill")) == 1, why
    assert f"worker {victim} was killed by signal 9 (SIGKILL)" in job.text, why
    restarts = [e for e in job.of("start") if e["size"] == 3]
    assert len(restarts) == 3 and sorted(e["rank"] for e in restarts) == [0, 1, 2], why
    assert victim not in {int(e["id"]) for e in restarts}, why
    commit = restarts[0]["step"]  # where the survivors went back to: the last commit
    assert {e["step"] for e in restarts} == {commit} and commit == step - step % 5, why
    final = _final_params(job, 3)
    # The reference: 3 workers (no --elastic) from the same commit, uninterrupted.
    ref = launch(["-np", "3"], {"START_FROM": out / f"{commit}.pt", "TOTAL_STEPS": 30})
    assert ref.rc == 0, ref.tail()
    assert final == pytest.approx(_final_params(ref, 3), abs=1e-5), why
    # ...and the comparison means something: the same 3-worker steps computed here (the
    # ranks' mean gradient) match too, but not from the commit before, nor at 4 ranks.
    assert final == pytest.approx(_simulate(out / f"{commit}.pt", 3), abs=1e-5), why
    assert final != pytest.approx(_simulate(out / f"{commit}.pt", 4), abs=1e-5), why
    if commit >= 10:
        assert final != pytest.approx(_simulate(out / f"{commit - 5}.pt", 3), abs=1e-5), why


def _simulate(commit_file, size, total=30):
    """tests/_elastic_train.py's steps from a commit, at `size` ranks, in this process."""
    import torch

    sys.path.insert(0, str(TESTS))
    saved = torch.load(commit_file)
    model = torch.nn.Linear(4, 1, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    from _elastic_data import batch

    for step in range(saved["step"], total):
        grads = []
        for rank in range(size):
            model.zero_grad()
            x, y = batch(step, rank, size)
            ((model(x) - y) ** 2).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / size
        opt.step()
    return [x for p in model.parameters() for x in p.detach().flatten().tolist()]


def test_replacement_worker_joins_at_next_commit_receives_state_and_trains_at_4(tmp_path):
    job = launch(["--elastic", "-np", "4", "--min-np", "2", "--max-np", "4",
                  "--max-restarts", "1"],
                 {"KILL_AT": "1:7", "TOTAL_STEPS": 10, "UNTIL_SIZE": 4, "EXTRA_STEPS": 5,
                  "STEP_SLEEP": 0.02})
    why = job.tail()
    assert job.rc == 0, why
    assert "started worker 4 on localhost in place of worker 1 (0 restarts left)" in job.text, why
    assert len(job.of("start", size=3)) == 3, why  # the survivors went on at 3 first
    grown = job.of("hosts_updated")
    assert len(grown) == 3 and {e["skip_sync"] for e in grown} == {False}, why
    assert len({e["step"] for e in grown}) == 1 and grown[0]["step"] % 5 == 0, why  # a commit
    new = job.of("start", id="4")
    assert len(new) == 1 and new[0]["size"] == 4 and new[0]["step"] == grown[0]["step"], why
    assert job.of("first_step", id="4"), why  # it trained
    _final_params(job, 4)  # with the same model as the others: it received the state


def test_below_min_np_the_job_stops_with_a_clear_message():
    t0 = time.monotonic()
    job = launch(["--elastic", "-np", "2", "--min-np", "2", "--max-np", "2"],
                 {"KILL_AT": "1:3", "TOTAL_STEPS": 1000, "STEP_SLEEP": 0.01})
    assert job.rc == 128 + signal.SIGKILL, job.tail()
    assert "collectives-run: 1 worker left, fewer than --min-np 2: stopping the job" \
        in job.text, job.tail()
    assert not job.of("done"), job.tail()
    assert time.monotonic() - t0 < 60


def test_discovery_script_adding_a_host_raises_hosts_updated_and_grows_the_world(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    job = launch(["--elastic", "-np", "2", "--min-np", "2", "--max-np", "3",
                  "--host-discovery-script", str(script), "--discovery-interval", "0.2"],
                 {"HOSTS_FILE": hosts, "ADD_HOST_AT": "6:127.0.0.1:1", "TOTAL_STEPS": 10,
                  "UNTIL_SIZE": 3, "STEP_SLEEP": 0.02})
    why = job.tail()
    assert job.rc == 0, why
    assert "started worker 2 on 127.0.0.1 (new host slot)" in job.text, why
    updated = job.of("hosts_updated")
    assert sorted(e["id"] for e in updated) == ["0", "1"], why
    assert {e["skip_sync"] for e in updated} == {False}, why
    assert not job.of("start", size=2)[2:], why  # no failure, no rollback
    assert job.of("first_step", id="2", size=3), why
    _final_params(job, 3)


@pytest.mark.parametrize("args, message", [
    (["-np", "4", "--min-np", "5"], "--elastic needs 1 <= --min-np (5) <= -np (4)"),
    (["-np", "4", "--max-np", "3"], "--elastic needs 1 <= --min-np (4) <= -np (4) <= --max-np (3)"),
    (["-np", "2", "--max-restarts", "-1"], "--max-restarts must be >= 0"),
    (["-np", "2", "--servers", "1"], "--elastic and --servers cannot be combined"),
    (["-np", "3", "-H", "localhost:2"], "-np 3 is more than the 2 slots on the hosts"),
])
def test_bad_elastic_options_are_refused_before_anything_starts(args, message, capsys):
    from collectives.launcher import cli as run

    with pytest.raises(SystemExit) as info:
        run.main(["--elastic", *args, "sh", "-c", "touch should-not-exist"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists("should-not-exist")


def test_discovery_script_listing_no_hosts_is_an_error(tmp_path):
    from collectives.launcher import cli as run

    script = tmp_path / "none.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    rc = run.main(["--elastic", "-np", "1", "--host-discovery-script", str(script),
                   "sh", "-c", "exit 3"])
    assert rc == 2


def test_example_survives_a_killed_worker_and_a_late_replacement_is_stopped():
    """examples/pytorch_elastic.py (DistributedOptimizer, reset callback) loses worker 2; its
    replacement is still importing torch when training ends (8 short steps later): it is
    stopped and the job succeeds."""
    from conftest import REPO

    job = launch(["--elastic", "-np", "3", "--min-np", "2", "--max-np", "3",
                  "--max-restarts", "1"], {},
                 script=REPO / "examples" / "pytorch_elastic.py",
                 script_args=["--epochs", "2", "--batches", "10", "--kill-at", "2:12"])
    text = job.text
    assert job.rc == 0, text[-6000:]
    assert "worker 2: killing myself at step 12" in text, text[-6000:]
    assert "world re-formed: 2 workers, resuming at epoch 1 batch 0" in text, text[-6000:]
    assert "done: " in text and "2 workers at the end" in text, text[-6000:]
    assert "started worker 3 on localhost in place of worker 2" in text, text[-6000:]
    assert "training is over: stopping worker 3, which never joined" in text, text[-6000:]


def test_states_commit_restore_sync_and_callbacks_in_one_process():
    """TorchState/ObjectState semantics, in this process (a world of 1, no launcher)."""
    import torch

    import collectives.torch as hvd

    hvd.init()
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        state = hvd.elastic.TorchState(model, opt, scheduler=sched, epoch=3, seen=[1])
        assert state.model is model and state.optimizer is opt and state.epoch == 3
        weight = model.weight.detach().clone()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        sched.step()
        state.epoch, state.seen = 4, [1, 2]
        assert not torch.equal(model.weight, weight)
        state.restore()  # back to construction time: model, optimizer, scheduler, attributes
        assert torch.equal(model.weight, weight) and state.epoch == 3 and state.seen == [1]
        assert opt.state_dict()["state"] == {} and sched.last_epoch == 0
        opt.step()  # momentum buffers exist from here (grads are still set)
        state.epoch = 5
        state.commit()  # save; no host updates outside --elastic
        committed = model.weight.detach().clone()
        opt.step()
        state.epoch = 6
        state.restore()
        assert torch.equal(model.weight, committed) and state.epoch == 5
        assert opt.state_dict()["state"]  # the momentum committed came back too
        calls = []
        state.register_reset_callbacks([lambda: calls.append(hvd.size())])
        state.on_reset()
        assert calls == [1]
        seen = []
        obj = hvd.elastic.ObjectState(lambda o: seen.append(o) or {"k": 7}, hvd.rank, k=1)
        obj.sync()  # Horovod's bcast_object is used, and its answer becomes the attributes
        assert seen == [{"k": 1}] and obj.k == 7

        @hvd.elastic.run
        def train(st, x):
            st.epoch += x
            return st.epoch

        assert train(state, 2) == 7  # outside --elastic: once, after sync()
        with pytest.raises(ValueError):
            hvd.elastic.run(lambda st: (_ for _ in ()).throw(ValueError("boom")))(state)
    finally:
        hvd.shutdown()


def test_elastic_sampler_skips_processed_samples_and_rolls_back_in_one_process():
    import torch

    import collectives.torch as hvd

    hvd.init()
    try:
        sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=True, seed=3)
        first = list(sampler)
        assert sorted(first) == list(range(10)) and len(sampler) == 10
        assert first == list(hvd.elastic.ElasticSampler(list(range(10)), seed=3))  # same seed
        model = torch.nn.Linear(1, 1)
        state = hvd.elastic.TorchState(model, None, train_sampler=sampler, batch=0)
        sampler.record_batch(0, 4)  # the first 4 of this iteration
        state.commit()
        sampler.record_batch(1, 4)
        assert len(sampler.processed_indices) == 8
        state.restore()  # back to the commit: 4 processed
        assert sampler.processed_indices == set(first[:4])
        state.sync()  # (one rank: the union is its own) re-shards the 6 left
        assert sorted(sampler) == sorted(first[4:]) and len(sampler) == 6
        sampler.set_epoch(1)
        assert len(sampler) == 10 and sorted(sampler) == list(range(10))
    finally:
        hvd.shutdown()


def test_elastic_sampler_shards_the_remaining_samples_over_the_new_world(monkeypatch):
    from collectives.torch import elastic_sampler as es

    shards = []
    for r in range(3):  # the three ranks of a world of 3, each asked in turn
        monkeypatch.setattr(es, "size", lambda: 3)
        monkeypatch.setattr(es, "rank", lambda r=r: r)
        sampler = es.ElasticSampler(list(range(11)), shuffle=False)
        sampler.load_state_dict({"epoch": 0, "processed_indices": {0, 1, 2, 3}})
        shards.append(list(sampler))
    assert [len(s) for s in shards] == [3, 3, 3]  # 7 left: padded to 9, 3 each
    assert sorted(set(sum(shards, []))) == list(range(4, 11))
    assert shards[0] == [4, 7, 10] and shards[1] == [5, 8, 4]


def test_discovery_script_removing_a_host_its_worker_leaves_at_the_next_commit(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n127.0.0.1:1\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    job = launch(["--elastic", "-np", "3", "--min-np", "2", "--max-np", "3",
                  "--host-discovery-script", str(script), "--discovery-interval", "0.2"],
                 {"HOSTS_FILE": hosts, "SET_HOSTS_AT": "8:localhost:2", "TOTAL_STEPS": 10,
                  "UNTIL_SIZE": 2, "STEP_SLEEP": 0.02})
    why = job.tail()
    assert job.rc == 0, why
    assert "worker(s) 2 leave at the next commit" in job.text, why
    assert "stopping worker 2 (its host is gone)" in job.text, why
    updated = job.of("hosts_updated")
    assert sorted(e["id"] for e in updated) == ["0", "1", "2"], why
    assert {e["skip_sync"] for e in updated} == {True}, why  # only removed: skip_sync
    at = updated[0]["step"]
    restarts = job.of("start", size=2)
    # no rollback: the two left go on from the commit where they were interrupted
    assert sorted(e["id"] for e in restarts) == ["0", "1"] and \
        {e["step"] for e in restarts} == {at}, why
    _final_params(job, 2)


def test_sigterm_to_the_elastic_launcher_stops_every_worker(tmp_path):
    """Plain collectives.init() under --elastic (no torch), then SIGTERM to the launcher."""
    code = ("import os, time, collectives\n"
            "comm = collectives.init()\n"
            "print(f'up {comm.Get_rank()} {comm.Get_size()} {os.getpid()}', flush=True)\n"
            "time.sleep(120)\n")
    cmd = [sys.executable, "-m", "collectives.run", "--elastic", "-np", "2", sys.executable,
           "-c", code]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, env=base_env(), cwd=str(RUN_CWD),
                         start_new_session=True, text=True)
    pids, lines = [], []
    try:
        for line in p.stdout:
            lines.append(line)
            if "<stdout>:up " in line:
                pids.append(int(line.split()[-1]))
                if len(pids) == 2:
                    break
        assert len(pids) == 2, "".join(lines)
        assert {ln.split("<stdout>:up ")[1].split()[1] for ln in lines if "up " in ln} == {"2"}
        os.kill(p.pid, signal.SIGTERM)
        rest, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:  # a failed check above: the launcher stops its workers
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert p.returncode == 128 + signal.SIGTERM, "".join(lines) + rest
    assert "received SIGTERM; stopped the workers" in rest
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]
