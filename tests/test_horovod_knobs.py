"""Horovod's HOROVOD_* variables: validated like COLLECTIVES_*, mapped, and documented."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

from collectives.torch import _knobs  # noqa: E402


@pytest.mark.parametrize("name,value", [
    ("HOROVOD_CYCLE_TIME", "fast"), ("HOROVOD_CYCLE_TIME", "-1"),
    ("HOROVOD_CACHE_CAPACITY", "1.5"), ("HOROVOD_FUSION_THRESHOLD", "64MB"),
    ("HOROVOD_STALL_CHECK_DISABLE", "maybe"), ("HOROVOD_LOG_LEVEL", "loud"),
    ("HOROVOD_GLOO_TIMEOUT_SECONDS", "0"), ("HOROVOD_AUTOTUNE", "2")])
def test_bad_value_names_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        _knobs.check_env({name: value})


def test_defaults_and_reads(monkeypatch):
    for k in _knobs.KNOBS:
        monkeypatch.delenv(k.name, raising=False)
    assert _knobs.cycle_time_s() == 0.001 and _knobs.cache_capacity() == 1024
    assert _knobs.stall_times(300.0) == (60.0, 300.0)
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3.5")
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "0")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "1")
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "20")
    assert _knobs.cycle_time_s() == 0.0035 and _knobs.cache_capacity() == 0
    assert _knobs.stall_times(300.0) == (0.0, 20.0)


def test_mapped_onto_ours_unless_ours_is_set(monkeypatch):
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "45")
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "12")
    monkeypatch.delenv("COLLECTIVES_TIMEOUT", raising=False)
    monkeypatch.setenv("COLLECTIVES_START_TIMEOUT", "99")
    _knobs.apply_mapped()
    assert os.environ["COLLECTIVES_TIMEOUT"] == "45"
    assert os.environ["COLLECTIVES_START_TIMEOUT"] == "99"


def test_readme_carries_the_table():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert _knobs.markdown_table() in readme
