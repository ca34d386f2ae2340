"""An experiment never destroys finished runs (nanospa/experiments/runner.py): a rerun into a
folder holding results merges into them (identical runs kept, not retrained; other methods
and rates carried over; table.md rewritten from the merged file) or is refused with one line
unless --replace=True; every finished run is in result.json before the line that announces
it, and a signal at any moment loses only the runs in progress (real processes and signals)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanospa.experiments import fig2, report

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--preset=tiny", "--lrs=1e-3,3e-3"]


def methods(out):
    return json.loads((out / "result.json").read_text())["methods"]


def test_a_rerun_with_fewer_methods_keeps_the_others(tmp_path, capsys):
    out = tmp_path / "o"
    assert fig2.main(TINY + ["--methods=softmax,espa", f"--out={out}"]) == 0
    first = methods(out)
    capsys.readouterr()
    assert fig2.main(TINY + ["--methods=espa", f"--out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "2 of them already in" in printed and "(kept)" in printed and " s)" not in printed.split("writing")[1]
    merged = methods(out)
    assert set(merged) == {"softmax", "espa"}                          # nothing lost
    for label in merged:
        assert [r["history"] for r in merged[label]["runs"]] == [r["history"] for r in first[label]["runs"]]
    table = (out / "table.md").read_text()
    assert "softmax" in table and "espa" in table


def test_a_rerun_with_another_rate_adds_it(tmp_path, capsys):
    out = tmp_path / "o"
    assert fig2.main(["--preset=tiny", "--lrs=1e-3", "--methods=espa", f"--out={out}"]) == 0
    assert fig2.main(["--preset=tiny", "--lrs=3e-3", "--methods=espa", f"--out={out}"]) == 0
    m = methods(out)["espa"]
    assert sorted(r["lr"] for r in m["runs"]) == [1e-3, 3e-3] and m["lrs"] == [1e-3, 3e-3]


def test_a_rerun_with_other_settings_is_refused_unless_replaced(tmp_path, capsys):
    out = tmp_path / "o"
    assert fig2.main(TINY + ["--methods=espa", f"--out={out}"]) == 0
    before = (out / "result.json").read_text()
    capsys.readouterr()
    assert fig2.main(TINY + ["--methods=espa", "--batch_size=3", f"--out={out}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "batch_size=2 there, 3 here" in err and "--replace=True" in err
    assert (out / "result.json").read_text() == before
    assert fig2.main(TINY + ["--methods=espa", "--n_layer=3", f"--out={out}"]) == 2         # another model
    assert "method espa is another model there" in capsys.readouterr().err
    (out / "result.json").write_text("{ not json")
    assert fig2.main(TINY + ["--methods=espa", f"--out={out}"]) == 2
    assert "cannot be read" in capsys.readouterr().err
    assert fig2.main(TINY + ["--methods=espa", "--batch_size=3", "--replace=True", f"--out={out}"]) == 0
    assert json.loads((out / "result.json").read_text())["settings"]["batch_size"] == 3


def test_a_signal_during_the_write_of_a_finished_run_waits_for_it(tmp_path, monkeypatch, capsys):
    """SIGTERM while result.json is being written: the write completes, the run is in the
    file and its line is printed, then the command stops (exit 143)."""
    out = tmp_path / "o"
    real, calls = report.write_json, []

    def write_then_signal(path, obj):
        calls.append(path)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)              # arrives inside the held block
            time.sleep(0.05)
        return real(path, obj)

    monkeypatch.setattr("nanospa.experiments.runner.write_json", write_then_signal)
    assert fig2.main(TINY + ["--methods=espa", "--workers=0", f"--out={out}"]) == 143
    runs = methods(out)["espa"]["runs"]
    assert len(runs) == 1 and "[1/2] espa" in capsys.readouterr().out


@pytest.mark.parametrize("after", [1, 2, 3])
def test_sigterm_right_after_a_progress_line_keeps_that_run(tmp_path, after):
    """A real process stopped as soon as it prints its k-th progress line: result.json holds
    at least those k runs, each complete (the line is printed only once the file holds it)."""
    out = tmp_path / "o"
    p = subprocess.Popen([sys.executable, "-m", "nanospa.experiments", "fig2", "--preset=tiny", "--workers=0",
                          "--lrs=1e-3,2e-3,3e-3,4e-3", "--methods=espa", f"--out={out}"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seen = 0
    for line in p.stdout:
        if line.startswith("["):
            seen += 1
            if seen == after:
                p.send_signal(signal.SIGTERM)
                break
    p.communicate(timeout=60)
    assert p.returncode in (0, 143)
    runs = methods(out)["espa"]["runs"]
    assert len(runs) >= after and all(r["history"] and r["final_train"] is not None for r in runs)


def test_one_writer_per_result_folder(tmp_path, capsys):
    """Two commands into one --out at once both exited 0 and said they wrote result.json, which
    held one process's methods only. Now the folder is locked for the whole command: the second
    stops at once, one line naming the holder, nothing trained, and the first ends complete."""
    out = tmp_path / "o"
    p = subprocess.Popen([sys.executable, "-m", "nanospa.experiments", "fig2", "--preset=tiny", "--workers=0",
                          "--lrs=1e-3,2e-3,3e-3,4e-3", "--methods=espa,softmax", f"--out={out}"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        for line in p.stdout:                      # the first run has started training
            if line.startswith("["):
                break
        t0 = time.time()
        assert fig2.main(TINY + ["--methods=uspa", f"--out={out}"]) == 2
        assert time.time() - t0 < 5
        captured = capsys.readouterr()
        assert captured.err.count("\n") == 1 and f"--out={out} is in use by pid {p.pid}" in captured.err
        assert "fig2" in captured.err and "[1/" not in captured.out         # names the command; trains nothing
        assert fig2.main(TINY + ["--methods=uspa", "--replace=True", f"--out={out}"]) == 2   # nor to replace it
    finally:
        rest, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert set(methods(out)) == {"espa", "softmax"} and all(len(m["runs"]) == 4 for m in methods(out).values())
    assert sorted(x.name for x in out.iterdir()) == sorted(["result.json", "table.md"] + ["plot.png"] * has_plot())
    assert fig2.main(TINY + ["--methods=uspa", f"--out={out}"]) == 0        # free again: merges into it
    assert set(methods(out)) == {"espa", "softmax", "uspa"}


def has_plot():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def test_a_run_without_a_key_is_kept_on_the_next_merge(tmp_path, capsys):
    """It was dropped: 145 committed runs had none. Now it is keyed from the recorded settings
    (with a note), kept and counted; a rerun of its very slot is refused (another sampler)."""
    out = tmp_path / "o"
    assert fig2.main(TINY + ["--methods=espa,softmax", f"--out={out}"]) == 0
    held = json.loads((out / "result.json").read_text())
    for m in held["methods"].values():
        for r in m["runs"]:
            del r["key"], r["checksum"]                               # as written before keys
    (out / "result.json").write_text(json.dumps(held))
    capsys.readouterr()
    assert fig2.main(["--preset=tiny", "--lrs=5e-3", "--methods=espa", f"--out={out}"]) == 0
    captured = capsys.readouterr()
    assert "4 run(s) had no key" in captured.err and "(and 4 more runs kept there)" in captured.out
    merged = methods(out)
    assert sorted(r["lr"] for r in merged["espa"]["runs"]) == [1e-3, 3e-3, 5e-3] and len(merged["softmax"]["runs"]) == 2
    assert merged["espa"]["lrs"] == [1e-3, 3e-3, 5e-3]
    assert "| espa |" in (out / "table.md").read_text() and "| softmax |" in (out / "table.md").read_text()
    assert fig2.main(["--preset=tiny", "--lrs=1e-3", "--methods=espa", f"--out={out}"]) == 2
    assert "holds a run of espa at lr 0.001, seed 0 made differently" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["edited", "duplicated"])
def test_an_edited_or_duplicated_run_is_refused_by_every_reader(how, tmp_path, capsys):
    """It was kept and averaged as another seed. The merge, --reuse and rerender refuse it,
    naming file, method, rate and seed; nothing is trained or written."""
    from nanospa.experiments import runner
    out = tmp_path / "o"
    assert fig2.main(TINY + ["--methods=espa", f"--out={out}"]) == 0
    held = json.loads((out / "result.json").read_text())
    runs = held["methods"]["espa"]["runs"]
    if how == "edited":
        runs[0]["final_train"] -= 0.5
    else:
        runs.append(dict(runs[0]))
    (out / "result.json").write_text(json.dumps(held))
    before = (out / "result.json").read_text()
    words = "does not match its checksum" if how == "edited" else "is there twice"
    capsys.readouterr()
    for argv in (TINY + ["--methods=espa", f"--out={out}"],
                 TINY + ["--methods=espa", f"--out={tmp_path / 'new'}", f"--reuse={out}"]):
        assert fig2.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"the run of espa at lr 0.001, seed 0 {words}" in err, err
    with pytest.raises(ValueError, match=words):
        runner.rerender(fig2, out)
    assert (out / "result.json").read_text() == before and not (tmp_path / "new").exists()
