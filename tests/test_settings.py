"""nanospa/run/settings.py, the one --key=value parser of every command: typed conversion,
tuples, bare flags, presets, unknown keys with the closest suggestion, the --help screen,
help notes read from a defaults block, the one-line error convention (run_command, describe,
the NANOSPA_DEBUG switch) and the output-path checks. The commands'
own uses are tested with them (tests/test_train.py, tests/test_experiments.py,
tests/test_bench.py, tests/test_signal_main.py)."""
import errno
import math
import os

import pytest

from nanospa.run.settings import (EXIT_BAD_INPUT, SettingsError, check_output_dir, check_output_file, convert,
                              describe, fail, help_text, parse_settings, run_command, source_notes, wants_help)


def test_settings_parser_types_and_presets():
    defaults = dict(preset="a", lrs=(1e-3,), n=1, flag=False, name="x")
    presets = dict(a=dict(n=2), b=dict(n=3, lrs=(5e-4,)))
    s = parse_settings(["--n=7", "--preset=b", "--lrs=1e-3,3e-3", "--flag"], defaults, presets)
    assert (s["n"], s["lrs"], s["flag"]) == (7, (1e-3, 3e-3), True)   # explicit beats preset
    with pytest.raises(SettingsError, match="expected int"):
        parse_settings(["--n=1.5"], defaults, presets)


def test_values_take_the_type_of_the_default():
    assert convert("lr", "1", 0.5) == 1.0 and isinstance(convert("lr", "1", 0.5), float)
    assert convert("n", "3", 1) == 3
    assert convert("name", "some file.txt", "x") == "some file.txt"      # a bare word is a string
    assert convert("name", "'float64'", "x") == "float64"                # a quoted one too
    assert convert("name", "3", "x") == "3"
    assert convert("flag", "true", False) is True and convert("flag", "False", True) is False
    assert convert("depths", "1,4,12", (), element=0) == (1, 4, 12)
    assert convert("lrs", "(1e-3, 3e-3)", (1e-3,)) == (1e-3, 3e-3)
    assert convert("names", "a,b", ("x",)) == ("a", "b")
    for key, raw, default in [("n", "2.5", 1), ("n", "True", 1), ("lr", "fast", 0.5), ("flag", "1", False),
                              ("lrs", "1e-3,fast", (1e-3,))]:
        with pytest.raises(SettingsError, match=f"^--{key}={raw}: expected "):
            convert(key, raw, default)


def test_explicit_keys_are_reported_and_defaults_are_not_changed():
    defaults = dict(n=1, m=2)
    s = parse_settings(["--m=5"], defaults)
    assert s == dict(n=1, m=5, _explicit={"m"}) and defaults == dict(n=1, m=2)


def test_preset_applies_first_wherever_it_stands():
    defaults = dict(preset="", n=1, m=1)
    presets = dict(big=dict(n=10, m=10))
    for argv in (["--preset=big", "--n=2"], ["--n=2", "--preset=big"]):
        s = parse_settings(argv, defaults, presets)
        assert (s["n"], s["m"]) == (2, 10)
    assert parse_settings(["--preset="], defaults, presets)["n"] == 1       # empty: no preset
    with pytest.raises(SettingsError, match="^unknown preset 'tpu'; presets: big$"):
        parse_settings(["--preset=tpu"], defaults, presets)


@pytest.mark.parametrize("argv, message", [
    (["--n_layers=3"], "unknown setting --n_layers; did you mean --n_layer?"),
    (["--zzz=3"], "unknown setting --zzz; --help lists the keys"),
    (["--n_layer"], "--n_layer needs a value: --n_layer=VALUE"),
    (["n_layer=3"], "unexpected argument 'n_layer=3': settings look like --key=value"),
    (["--=3"], "unexpected argument '--=3': settings look like --key=value"),
])
def test_bad_arguments_name_the_problem(argv, message):
    with pytest.raises(SettingsError) as e:
        parse_settings(argv, dict(n_layer=12, flag=False))
    assert str(e.value) == message


def test_wants_help():
    assert wants_help(["--n=1", "--help"]) and wants_help(["-h"]) and wants_help(["help"])
    assert not wants_help(["--n=1"]) and not wants_help([])


def test_help_lists_every_key_with_its_default_and_note_in_one_column():
    text = help_text("title line", dict(preset="a", lrs=(1e-3, 3e-3), name="x", n=1),
                     dict(lrs="the grid", n="a count"), dict(a=dict(n=2)))
    lines = text.splitlines()
    assert lines[:3] == ["title line", "", "settings (--key=value):"]
    assert lines[3:7] == ["  --preset='a'", "  --lrs=0.001,0.003  the grid", "  --name='x'",
                          "  --n=1              a count"]
    assert lines[7] == "preset a: n=2"


def test_source_notes_read_the_comments_of_a_defaults_block(tmp_path):
    path = tmp_path / "defaults.py"
    path.write_text('DEFAULTS = dict(\n    out_dir="out",   # folder for the outputs\n    seed=0,\n)\n'
                    "class Config:\n    width: int = 8   # model width (C)\n    out_dir: str = ''  # not this one\n"
                    "TOP = 1  # top-level names are not settings\n", encoding="utf-8")
    assert source_notes(path) == dict(out_dir="folder for the outputs", width="model width (C)")


def test_fail_prints_one_line_and_returns_the_bad_input_status(capsys):
    assert fail(ValueError("two\n   lines")) == EXIT_BAD_INPUT == 2
    assert capsys.readouterr().err == "error: two lines\n"


# ----------------------------------------------------------------------------- failures

def _raise(error):
    raise error


@pytest.mark.parametrize("error, line", [
    (SettingsError("unknown setting --x"), "error: unknown setting --x"),
    (OSError(errno.ENOSPC, "No space left on device", "out/log.jsonl"), "error: out/log.jsonl: No space left on device"),
    (OSError(errno.ENOSPC, "No space left on device"), "error: OSError: No space left on device"),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "out/ckpt.npz"), "error: out/ckpt.npz: Is a directory"),
    (MemoryError("Unable to allocate 8.00 GiB"), "error: out of memory (Unable to allocate 8.00 GiB); use a smaller "
                                                  "batch_size, block_size or model"),
    (RuntimeError("device 'cuda' needs CuPy"), "error: device 'cuda' needs CuPy"),
    (TypeError("bad operand"), "error: unexpected TypeError: bad operand (a bug in nanospa? NANOSPA_DEBUG=1 shows "
                               "the traceback)"),
])
def test_run_command_turns_every_failure_into_one_line_and_status_2(error, line, capsys, monkeypatch):
    monkeypatch.delenv("NANOSPA_DEBUG", raising=False)
    assert run_command(_raise, error) == 2
    assert capsys.readouterr().err == line + "\n"
    assert describe(error) == line[len("error: "):]


def test_run_command_statuses_and_the_debug_switch(capsys, monkeypatch):
    monkeypatch.delenv("NANOSPA_DEBUG", raising=False)
    assert run_command(lambda: 0) == 0
    assert run_command(_raise, ArithmeticError("nan"), diverged=ArithmeticError) == 1     # divergence: 1
    assert capsys.readouterr().err == "error: nan\n"
    assert run_command(_raise, KeyboardInterrupt()) == 130
    assert capsys.readouterr().err == "interrupted\n"
    for on in ("1", "yes"):
        monkeypatch.setenv("NANOSPA_DEBUG", on)
        with pytest.raises(OSError):
            run_command(_raise, OSError(errno.ENOSPC, "No space left on device"))
    monkeypatch.setenv("NANOSPA_DEBUG", "0")
    assert run_command(_raise, ValueError("x")) == 2


def test_output_paths_are_checked_without_creating_anything(tmp_path):
    check_output_dir(tmp_path / "a" / "b", "out")
    check_output_file(tmp_path / "plot.png", "plot")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(SettingsError, match=r"^--out=.*file: .*file is a file, not a folder$"):
        check_output_dir(tmp_path / "file", "out")
    with pytest.raises(SettingsError, match="is a file, so no folder can be made under it"):
        check_output_dir(tmp_path / "file" / "sub", "out")
    with pytest.raises(SettingsError, match=r"^--plot=.*: its folder .*missing does not exist$"):
        check_output_file(tmp_path / "missing" / "fig.png", "plot")
    with pytest.raises(SettingsError, match="its folder .*file is a file"):
        check_output_file(tmp_path / "file" / "fig.png", "plot")
    with pytest.raises(SettingsError, match="a folder, not a file"):
        check_output_file(tmp_path, "plot")
    check_output_file("fig.png", "plot")                      # the working folder
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    with pytest.raises(SettingsError, match="dangling link"):
        check_output_dir(tmp_path / "link", "out")


@pytest.mark.parametrize("argv", [["--lr=1e999"], ["--lr=-1e999"], ["--lrs=1e-3,1e999"], ["--lr=1" + "0" * 400]])
def test_a_float_setting_must_be_finite(argv):
    """1e999 reads as inf (and an int beyond any float overflows): no setting means that."""
    with pytest.raises(SettingsError, match=r"^--lrs?=.*: must be a finite number$"):
        parse_settings(argv, dict(lr=1e-3, lrs=(1e-3,)))


def test_every_command_refuses_an_infinite_setting(tmp_path, capsys):
    """The one parser: train.py (K-FAC's kl_clip and adam_lr_ratio passed their own checks as
    inf), the experiments, sample.py, the signal command, all before any data is read."""
    import sample
    import train
    from nanospa.experiments.__main__ import main as experiments
    from nanospa.signal.__main__ import main as signal_command
    for command, argv in ((train.main, ["--kfac_kl_clip=1e999"]), (train.main, ["--kfac_adam_lr_ratio=1e999"]),
                          (experiments, ["fig2", "--lrs=1e999"]), (sample.main, ["--temperature=1e999"]),
                          (signal_command, ["--rho_final=1e999"])):
        extra = [f"--out_dir={tmp_path / 'o'}", f"--data={tmp_path / 'none.txt'}"] if command is train.main else []
        assert command(argv + extra) == 2                 # (without the check: another error, or a run)
        err = capsys.readouterr().err
        assert err.startswith("error: --") and "must be a finite number" in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_kfac_refuses_infinite_settings_in_python_too():
    from nanospa import GPT
    from nanospa.beyond.kfac import KFAC
    from conftest import tiny_config
    model = GPT(tiny_config())
    for key in ("kl_clip", "adam_lr_ratio", "weight_decay"):
        with pytest.raises(ValueError, match=f"{key} must be finite"):
            KFAC(model, **{key: math.inf})


@pytest.mark.parametrize("path, words", [("", "is empty"), ("  ", "is empty"), ("a\0b", "NUL byte")])
def test_an_empty_or_unusable_output_path_is_refused(path, words):
    """Path("") is the current folder: an empty --out_dir wrote the run wherever it started."""
    for check in (check_output_dir, check_output_file):
        with pytest.raises(SettingsError, match=words):
            check(path, "out_dir")
