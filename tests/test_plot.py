"""python -m nanospa.plot: a picture of real training runs side by side (losses, and cos[l],
q[l] over layer x step); a folder without a log, a log without records and a missing
matplotlib are one error line, exit 2."""
import builtins

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
