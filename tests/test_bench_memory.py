"""nanospa/bench/memory.py: resident-set fields from /proc, the probe process's JSON line,
and a real CPU probe of a tiny configuration in a fresh process (Linux only: the figures
come from /proc/self/status)."""
import json
import sys
from pathlib import Path

import pytest

from nanospa.bench import memory as bench_memory

ROOT = Path(__file__).resolve().parents[1]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


@linux
def test_status_fields_are_bytes_and_the_peak_is_the_high_water_mark():
    rss, peak = bench_memory.status_bytes("VmRSS"), bench_memory.status_bytes("VmHWM")
    assert 0 < rss <= peak and rss % bench_memory.KIB == 0
    assert bench_memory.status_bytes("NoSuchField") is None


@linux
def test_probe_line_is_one_json_object():
    line = bench_memory.probe_line(base=123)
    d = json.loads(line)
    assert "\n" not in line and d["base_rss"] == 123 and d["peak_rss"] > 0


@linux
def test_a_cpu_probe_measures_a_fresh_process(monkeypatch):
    monkeypatch.chdir(ROOT)
    m = bench_memory.measure_cpu("nanospa", ["--config=tiny", "--threads=1", "--memory_steps=1"])
    assert 0 < m["peak_bytes"] < m["process_peak_bytes"]


def test_a_failing_probe_raises_with_its_error():
    with pytest.raises(RuntimeError, match="memory probe for nanospa failed: .*unknown configuration"):
        bench_memory.measure_cpu("nanospa", ["--config=huge"])
