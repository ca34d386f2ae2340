"""python -m nanospa.plot: a picture of real training runs side by side (losses, and cos[l],
q[l] over layer x step); a folder without a log, a log without records and a missing
matplotlib are one error line, exit 2."""
import builtins
import json

import pytest

import train
from nanospa.plot import __main__ as plot_command
from nanospa.plot import runs

from test_train import TINY, text_file  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))


def test_two_real_runs_side_by_side(tmp_path, text_file, capsys):
    pytest.importorskip("matplotlib")
    for name, extra in (("a", []), ("b", ["--n_layer=3"])):
        assert train.main(TINY + [f"--data={text_file}", f"--out_dir={tmp_path / name}", "--max_iters=20",
                                  "--eval_interval=10", "--log_interval=2", "--sample_tokens=0", *extra]) == 0
    got = runs([tmp_path / "a", tmp_path / "b"])
    assert [n for n, _ in got] == ["a", "b"]
    assert len([r for r in got[1][1] if "cos" in r]) == 3 and len(got[1][1][0]["cos"]) == 4   # init, 10, 20; L + 1
    out = tmp_path / "run.png"
    assert plot_command.main([str(tmp_path / "a"), str(tmp_path / "b"), f"--out={out}"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert "wrote" in capsys.readouterr().out


def test_bad_folders_and_settings_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plot_command, "need_matplotlib", lambda command: None)   # the checks, with or without it
    def refused(args, words):
        assert plot_command.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    refused([str(tmp_path)], "holds no log.jsonl")
    (tmp_path / "log.jsonl").write_text("")
    refused([str(tmp_path)], "holds no records")
    (tmp_path / "log.jsonl").write_text('{"iter": 0}\nnot json\n{"iter": 1}\n')
    refused([str(tmp_path)], "line 2 is not a JSON record")
    refused([str(tmp_path), "--width=3"], "unknown setting --width=3")


def test_without_matplotlib_it_says_so_before_reading(tmp_path, monkeypatch, capsys):
    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert plot_command.main([str(tmp_path / "nowhere")]) == 2
    assert "needs matplotlib, which is not installed" in capsys.readouterr().err


def write_log(folder, *records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


GOOD = [dict(iter=0, train_loss=5.0, val_loss=5.1, cos=[0.1, 0.2], q=[1.0, 1.0]), dict(iter=1, train_loss=4.0, lr=1e-3)]


@pytest.mark.parametrize("bad, words", [
    ([1, 2], "line 3 is not a record train.py writes (a list, not a record)"),
    (dict(train_loss=3.0), "line 3 is not a record train.py writes (iter=None, not a whole number >= 0)"),
    (dict(iter="2", train_loss=3.0), "(iter='2', not a whole number >= 0)"),
    (dict(iter=2, train_loss="3.0"), "(train_loss='3.0', not a number)"),
    (dict(iter=2, val_loss=[3.0]), "(val_loss=[3.0], not a number)"),
    (dict(iter=2, cos=[0.1, 0.2, 0.3], q=[1.0, 1.0, 1.0]), "(cos has 3 layers, the run's earlier records 2)"),
    (dict(iter=2, cos="0.1", q=[1.0]), "(cos is not a list of numbers)"),
])
def test_a_hand_edited_log_is_one_line_not_a_traceback(bad, words, tmp_path, monkeypatch, capsys):
    """These raised TypeError or KeyError from inside the drawing."""
    monkeypatch.setattr(plot_command, "need_matplotlib", lambda command: None)
    write_log(tmp_path / "a", *GOOD, bad)
    assert plot_command.main([str(tmp_path / "a"), f"--out={tmp_path / 'p.png'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / 'a' / 'log.jsonl'}: ") and words in err, err
    assert not (tmp_path / "p.png").exists()


def test_a_log_holding_two_runs_is_drawn_as_two(tmp_path, capsys):
    """Two runs appended to one file were drawn as one zigzag run."""
    write_log(tmp_path / "a", *GOOD, dict(iter=2, train_loss=3.5), dict(iter=0, train_loss=6.0, cos=[0.5, 0.5, 0.5],
                                                                        q=[1.0, 1.0, 1.0]), dict(iter=1, train_loss=5.0))
    got = runs([tmp_path / "a"])
    assert [n for n, _ in got] == ["a (run 1 of 2)", "a (run 2 of 2)"]
    assert [[r["iter"] for r in records] for _, records in got] == [[0, 1, 2], [0, 1]]
    assert "holds 2 runs (its iterations go back at record 4)" in capsys.readouterr().err
    changed = dict(iter=1, changed_on_resume=dict(batch_size=[4, 2]))     # a resume's note is no new run
    write_log(tmp_path / "b", *GOOD, changed, dict(iter=2, train_loss=3.0))
    assert [n for n, _ in runs([tmp_path / "b"])] == ["b"]


def test_the_picture_is_exactly_the_file_it_names(tmp_path, capsys):
    """--out=DIR printed 'wrote DIR' and matplotlib wrote DIR.png."""
    pytest.importorskip("matplotlib")
    write_log(tmp_path / "a", *GOOD, dict(iter=1, changed_on_resume=dict(batch_size=[4, 2])), dict(iter=2, train_loss=3.0))
    assert plot_command.main([str(tmp_path / "a"), f"--out={tmp_path / 'pic'}"]) == 2
    assert "--out=" in capsys.readouterr().err and sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    (tmp_path / "dir.png").mkdir()
    assert plot_command.main([str(tmp_path / "a"), f"--out={tmp_path / 'dir.png'}"]) == 2
    assert "a folder, not a file" in capsys.readouterr().err
    for name, magic in (("pic.png", b"\x89PNG"), ("pic.svg", b"<?xml"), ("pic.PDF", b"%PDF")):
        assert plot_command.main([str(tmp_path / "a"), f"--out={tmp_path / name}"]) == 0
        assert capsys.readouterr().out.startswith(f"wrote {tmp_path / name}: a")
        assert (tmp_path / name).read_bytes()[:len(magic)] == magic
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "dir.png", "pic.PDF", "pic.png", "pic.svg"]
