"""nanospa/experiments/report.py: result.json's layout, the table's number formats, table.md
rows and notes, the plot (or the hint when matplotlib is missing), provenance and the
helpers of the experiments' findings. The files of real runs are checked end to end in
tests/test_experiments.py."""
import json
import math
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from nanospa.experiments import report
from nanospa.experiments.report import MATCH_MARGIN, STALL_MARGIN


def method_summary(final_train, best_lr=1e-3, unigram=3.0, curve=None):
    return dict(by_lr={"0.001": final_train, "0.003": math.inf}, best_lr=best_lr, final_train=final_train,
                final_train_std=0.01, final_val=final_train + 0.1, below_unigram=unigram - final_train,
                stalled=unigram - final_train < STALL_MARGIN,
                curve=curve if curve is not None else [[i, 4.0 - i / 100] for i in range(0, 101, 10)])


def result(**methods):
    return dict(name="demo", title="a demo", paper="The paper says so.", findings=["one finding"],
                settings=dict(n_layer=4, n_embd=16, n_head=2, block_size=16, batch_size=2, steps=100,
                              lrs=[1e-3, 3e-3], seeds=1, dtype="float32", preset="tiny"),
                data=dict(name="default", train_tokens=1000, unigram_entropy=3.0, vocab_size=256),
                provenance=dict(command="python -m nanospa.experiments demo", date="2026-01-01T00:00:00",
                                machine="a CPU", load_average_start=[0.1, 0.1, 0.1],
                                load_average_end=[0.2, 0.2, 0.2], seconds=75.0, commit="abc123"),
                methods={label: dict(description=f"model {label}", steps=100, summary=s,
                                     config=dict(attention="espa", activation="tat_lrelu"),
                                     plan=dict(policy="joint", gamma_final=0.0123, eta=0.9))
                         for label, s in methods.items()})


def test_write_json_puts_number_lists_on_one_line_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "result.json"
    obj = dict(history=[[0, 5.0], [1, 4.5]], lrs=(1e-3, 3e-3), nested=dict(x=np.float32(0.5), a=np.arange(2)),
               words=["a", "b"], nan=math.nan, view=types.MappingProxyType(dict(policy="joint", eta=0.5)))
    report.write_json(path, obj)
    text = path.read_text()
    assert '"history": [[0,5.0],[1,4.5]]' in text and '"lrs": [0.001,0.003]' in text
    assert '"words": [\n' in text                                   # not numbers: indented as usual
    assert json.loads(text) == dict(history=[[0, 5.0], [1, 4.5]], lrs=[1e-3, 3e-3], nested=dict(x=0.5, a=[0, 1]),
                                    words=["a", "b"], nan=pytest.approx(math.nan, nan_ok=True),
                                    view=dict(policy="joint", eta=0.5))
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_number_formats():
    assert report.fmt(None) == report.fmt(math.nan) == "-"
    assert report.fmt(math.inf) == "diverged" and report.fmt(2.34567) == "2.346"
    assert report.fmt(1e-3, "g") == "0.001"
    assert report.duration(75.4) == "1 min 15 s" and report.duration(9.6) == "10 s"
    assert report.command_line("fig2", ["--preset=tiny", "--data=my file.txt"]) == \
        "python -m nanospa.experiments fig2 --preset=tiny '--data=my file.txt'"


def test_markdown_has_provenance_a_row_per_method_and_the_notes():
    r = result(good=method_summary(2.0), edge=method_summary(2.5, best_lr=3e-3),
               gone=method_summary(math.nan, best_lr=None))
    r["methods"]["gone"]["summary"]["by_lr"] = {"0.001": math.inf, "0.003": math.inf}
    md = report.markdown(r)
    assert md.startswith("# demo: a demo\n\n- Command: `python -m nanospa.experiments demo`\n")
    assert "- Time taken: 1 min 15 s (wall clock)" in md and "- Code: commit abc123" in md
    assert "| method | model | steps | best lr | final train loss | final val loss | unigram - train " \
           "| train @ lr 0.001 | train @ lr 0.003 |" in md
    assert "| good | model good | 100 | 0.001 | 2.000 | 2.100 | +1.000 | 2.000 | diverged |" in md
    assert "| gone | model gone | 100 | - | - | - | - | diverged | diverged |" in md
    assert "good: budget joint, gamma_final 0.0123, eta 0.9" in md
    assert "Best learning rate at an edge of the grid" in md and "edge (0.003)" in md
    assert "One learning rate only" not in md
    r["methods"]["one"] = dict(r["methods"]["good"], lrs=[0.01], description="model one")
    md = report.markdown(r)
    assert "One learning rate only, no search (its best rate is not known): one (0.01)." in md
    assert "one (0.01)" not in md.split("Best learning rate at an edge")[1].split("\n")[0]
    r["methods"].pop("one")
    md = report.markdown(r)
    assert md.endswith("## What the paper reports\n\nThe paper says so.\n\n## What nanospa measured\n\n- one finding\n")


def test_plot_writes_a_png_or_says_how_to_get_matplotlib(tmp_path, monkeypatch, capsys):
    r = result(a=method_summary(2.0), b=method_summary(2.5))
    if _has_matplotlib():
        assert report.plot(r, tmp_path / "plot.png", [("panel", ["a", "b", "not run"])]) is True
        assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)            # import matplotlib now fails
    assert report.plot(r, tmp_path / "none.png") is False
    assert not (tmp_path / "none.png").exists() and report.PLOT_HINT in capsys.readouterr().out


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def test_provenance_names_command_machine_and_time():
    p = report.provenance("fig2", ["--preset=tiny"], dict(device="cpu", _load_start=[1.0, 1.0, 1.0]),
                          "2026-01-01T00:00:00+00:00", t0=0.0)
    assert p["command"] == "python -m nanospa.experiments fig2 --preset=tiny"
    assert p["date"] == "2026-01-01T00:00:00+00:00" and p["load_average_start"] == [1.0, 1.0, 1.0]
    assert "CPU cores" in p["machine"] and "NumPy" in p["machine"] and p["seconds"] > 0
    assert p["commit"] == report.git_commit()                        # asked once per process


def test_loss_line_reads_the_gap_to_the_unigram_entropy():
    r = result(learnt=method_summary(2.0), stalled=method_summary(3.0 - STALL_MARGIN / 2),
               above=method_summary(3.5), gone=method_summary(math.nan, best_lr=None))
    assert report.loss_line(r, "learnt") == \
        "learnt: final train loss 2.000, 1.000 nats below the unigram entropy: it learnt more than byte frequencies"
    r_bpe = {**r, "data": {**r.get("data", {}), "tokenizer": "bpe:2048"}}
    assert report.loss_line(r_bpe, "learnt").endswith("it learnt more than token frequencies")
    assert report.loss_line(r, "stalled").endswith(f"within {STALL_MARGIN} nats of the unigram entropy (+0.050 below): stalled")
    assert report.loss_line(r, "above").endswith("0.500 nats above the unigram entropy: stalled above it")
    assert report.loss_line(r, "gone") == "gone: diverged at every learning rate"
    assert report.loss_line(r, "missing") == "missing: not run"
    assert report.summary(r, "missing") is None and report.summary(r, "learnt")["final_train"] == 2.0


def test_ranking_and_loss_at_a_fraction_of_the_run():
    r = result(a=method_summary(2.5), b=method_summary(2.0), gone=method_summary(math.nan, best_lr=None))
    assert report.ranking(r, ["a", "b", "gone", "missing"]) == ["b", "a"]
    # the curve falls by 0.01 per 1 % of the run; a LOSS_WINDOW window around 50 % averages 45..55
    assert report.loss_at(r, "a", 0.5) == pytest.approx(3.5)
    assert math.isnan(report.loss_at(r, "missing", 0.5))
    r["methods"]["gone"]["summary"]["curve"] = []
    assert math.isnan(report.loss_at(r, "gone", 0.5))
    assert 0 < MATCH_MARGIN < STALL_MARGIN


def test_each_process_writes_through_its_own_temporary(tmp_path, monkeypatch):
    """Two commands writing one folder's result.json shared result.json.tmp, and one crashed
    when the other renamed it away: the temporary is PATH.PID.tmp now."""
    seen, real = [], os.replace
    monkeypatch.setattr(report.os, "replace", lambda a, b: (seen.append(Path(a).name), real(a, b)))
    report.write_text(tmp_path / "table.md", "x")
    assert seen == [f"table.md.{os.getpid()}.tmp"] and (tmp_path / "table.md").read_text() == "x"


def test_the_setting_line_is_what_each_method_trained():
    """A method that sets its own width (scaling's) trained that width, whatever --n_embd
    said: the table named the --n_embd given. Now the line reports what every method trained,
    and a shape that differs among methods gets a column with each one's."""
    r = result(narrow=method_summary(2.0), wide=method_summary(2.5))
    assert "- Setting: depth 4, width 16, 2 heads, T = 16, batch 2" in report.markdown(r)      # from the configs' defaults
    for m in r["methods"].values():
        m["config"].update(n_embd=64, n_head=4)                           # both overrode the command's width
    md = report.markdown(r)
    assert "- Setting: depth 4, width 64, 4 heads, T = 16, batch 2" in md and "width 16" not in md
    r["methods"]["wide"]["config"].update(n_embd=128, n_layer=8)
    md = report.markdown(r)
    assert ("- Setting: depth per method, width per method, 4 heads, T = 16 (each method's in the column "
            "n_layer x n_embd), batch 2") in md
    assert "| method | model | n_layer x n_embd | steps |" in md
    assert "| narrow | model narrow | 4 x 64 | 100 |" in md and "| wide | model wide | 8 x 128 | 100 |" in md
