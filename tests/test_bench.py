"""python -m nanospa.bench (nanospa/bench/command.py): it runs once on a tiny configuration and
reports what it should (no time is asserted: the benchmark is not a test); its settings
are nanospa's --key=value, bad ones give one error: line and exit status 2.

The parts have their own files: tests/test_bench_measure.py (the FLOP formula, the timed
rounds), test_bench_memory.py, test_bench_report.py, test_bench_torch.py (the PyTorch
yardstick). The engine fast paths the benchmark led to are tested next to the code they
live in (tests/test_functions.py, test_fused.py, test_tensor.py, test_backend.py, ...).
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nanospa import GPTConfig, backend
from nanospa.bench.command import DEFAULTS, MODEL_KEYS, main, parse_args
from nanospa.bench.measure import CONFIGS, model_flops
from nanospa.run.settings import SettingsError

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

ROOT = Path(__file__).resolve().parents[1]


def test_bench_command_runs_on_a_tiny_configuration():
    cmd = [sys.executable, "-m", "nanospa.bench", "--config=tiny", "--steps=2", "--warmup=1",
           "--threads=1", "--torch=no", "--gemm_n=64", "--settle=0", "--n_layer=3", "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"date", "command", "cpu", "numpy", "env"} <= set(report["machine"])
    (r,) = report["results"]
    assert r["config"] == "tiny" and r["gpt_config"]["n_layer"] == 3 and r["threads"] == 1
    assert r["model_flops"]["per_step"] == model_flops(GPTConfig(**r["gpt_config"]), r["batch_size"])["per_step"]
    nano = r["frameworks"]["nanospa"]
    assert set(r["frameworks"]) == {"nanospa"} and "ratio_nanospa_over_pytorch" not in r
    assert nano["tokens_per_s"] > 0 and r["gemm_peak_flops"] > 0 and np.isfinite(nano["mfu"])
    assert nano["step_s_min"] <= nano["step_s_median"] <= nano["step_s_max"]
    if sys.platform.startswith("linux"):  # resident-set figures come from /proc
        assert 0 < nano["peak_mem_bytes"] < nano["process_peak_rss_bytes"]


def test_bench_blas_mode_times_the_users_own_loop():
    """--cpu_threading=blas: one thread over an n-thread BLAS, what a plain loop gets."""
    cmd = [sys.executable, "-m", "nanospa.bench", "--config=tiny", "--steps=1", "--warmup=1", "--threads=2",
           "--cpu_threading=blas", "--torch=no", "--gemm_n=64", "--settle=0", "--n_layer=1", "--no_memory=True",
           "--batch_size=8", "--block_size=64", "--n_embd=128", "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    th = report["machine"]["threads"]
    assert th["mode"] == "blas" and th["blas_threads"] == 2 and th["nanospa_threads"] == 1
    assert report["results"][0]["frameworks"]["nanospa"]["tokens_per_s"] > 0


def test_bench_rejects_unknown_configuration(capsys):
    assert main(["--config=huge"]) == 2
    names = ", ".join(CONFIGS)                               # every configuration the benchmark has
    assert capsys.readouterr().err == f"error: unknown configuration 'huge'; choose among {names}\n"


@pytest.mark.parametrize("argv, message", [
    (["--set", "n_layer=24"], "--set KEY=VALUE is now --KEY=VALUE, e.g. --n_layer=24 or --batch_size=4"),
    (["--stepz=3"], "unknown setting --stepz; did you mean --steps?"),
    (["--steps=fast"], "--steps=fast: expected int like the default 10"),
    (["--threads=0"], "--threads must be >= 1, got 0"),
    (["--warmup=-1"], "--warmup must be >= 0, got -1"),
    (["--device=tpu"], "--device=tpu: one of cpu, cuda"),
    (["--cpu_threading=omp"], "--cpu_threading=omp: one of shards, blas"),
    (["--config=tiny", "--n_head=3", "--torch=no", "--no_memory", "--steps=1", "--warmup=0", "--gemm_n=8",
      "--settle=0"], "GPTConfig.n_embd=32 is not divisible by n_head=3"),
    (["--n_layer=0"], "GPTConfig.n_layer must be a positive integer, got 0"),       # before any timing
    (["--batch_size=0"], "--batch_size must be >= 1, got 0 (leave it unset for the configuration's own)"),
    (["--block_size=-4"], "GPTConfig.block_size must be a positive integer, got -4"),
    (["--torch_sdpa=True"], "--torch_sdpa is gone: the PyTorch yardstick always runs scaled_dot_product_attention "
                            "(--torch=eager|compile|both picks its rows)"),
    (["--torch=auto"], "--torch=auto is now --torch=both (the default: eager and torch.compile rows, when torch "
                       "imports); or --torch=eager, compile, no"),
    (["--torch=fast"], "--torch=fast: one of both, eager, compile, no"),
])
def test_bad_settings_give_one_line_and_status_2(argv, message, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_gives_one_line(capsys):
    assert main(["--config=tiny", "--device=cuda", "--torch=no"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device 'cuda'") and err.count("\n") == 1


def test_settings_are_typed_and_model_fields_override_only_when_set():
    s = parse_args(["--config=tiny,ref", "--n_layer=3", "--batch_size=4", "--json", "--settle=0",
                    "--attention=softmax"])
    assert s["config"] == ("tiny", "ref") and s["json"] is True and s["settle"] == 0.0
    assert s["overrides"] == dict(n_layer=3, batch_size=4, attention="softmax")
    assert parse_args([])["overrides"] == {} and parse_args([])["config"] == ("ref",)
    for bad in ("--batch_size=0", "--batch_size=-2"):    # unset is the configuration's; 0 is refused
        with pytest.raises(SettingsError, match="--batch_size must be >= 1"):
            parse_args([bad])
    with pytest.raises(SettingsError, match="needs a value"):
        parse_args(["--n_layer"])


def test_help_lists_every_setting(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = {line.split("=")[0].strip() for line in out.splitlines() if line.startswith("  --")}
    assert listed == {f"--{k}" for k in DEFAULTS if k not in MODEL_KEYS and not k.startswith("memory_")}
    assert all(f"--{k}" in out for k in MODEL_KEYS) and "--n_layer" in out


def test_kfac_step_is_timed_beside_adamw_with_the_flops_it_adds():
    cmd = [sys.executable, "-m", "nanospa.bench", "--config=tiny", "--steps=2", "--warmup=1", "--threads=1",
           "--torch=no", "--gemm_n=64", "--settle=0", "--kfac=True", "--kfac_inv_interval=2", "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (r,) = json.loads(out.stdout)["results"]
    assert set(r["frameworks"]) == {"nanospa", "nanospa_kfac"}
    k = r["kfac"]
    assert k["inv_interval"] == 2 and k["step_over_adamw_median"] > 0
    # the count of docs/kfac.md §10, by hand for the tiny model: L 2, C 32, MLP 128, V 256, B 2, T 16
    shapes = 2 * [(32, 32)] * 4 + 2 * [(32, 128), (128, 32)] + [(32, 256)]
    rows = 0.25 * 2 * 16
    by_hand = (0.25 * r["model_flops"]["per_step"] + sum(2 * rows * (a * a + b * b) for a, b in shapes)
               + sum(4 * a * b * (a + b) for a, b in shapes) + sum(9 * (a ** 3 + b ** 3) for a, b in shapes) / 2)
    assert k["flops"]["per_step"] == pytest.approx(by_hand, rel=1e-12)
    if sys.platform.startswith("linux"):
        assert r["frameworks"]["nanospa_kfac"]["peak_mem_bytes"] > 0


def test_bad_kfac_setting_is_one_line(capsys):
    assert main(["--config=tiny", "--kfac=True", "--kfac_damping=-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "kfac_damping" in err


@pytest.mark.parametrize("argv, message", [
    (["--steps=0"], "--steps must be at least 1, got 0"),          # was a ZeroDivisionError traceback, exit 1
    (["--warmup=-1"], "--warmup must be >= 0, got -1"),            # was a full run
    (["--rounds=0"], "--rounds must be at least 1, got 0"),
    (["--layouts="], "--layouts must be at least one RANKSxTHREADS layout, got ()"),
    (["--layouts=0x2"], "layout '0x2' must look like RANKSxTHREADS, e.g. 2x1"),
    (["--dtype=int8"], "--dtype must be float32 or float64, got 'int8'"),
    (["--config=nope"], "unknown config 'nope'; configurations: " + ", ".join(CONFIGS)),
])
def test_the_ranks_benchmark_checks_its_settings_first(argv, message, capsys):
    from nanospa.bench import ranks
    assert ranks.main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_the_ranks_benchmark_without_mpiexec_says_how_to_install(capsys, monkeypatch):
    from nanospa.bench import ranks
    monkeypatch.setattr(ranks, "mpiexec", lambda: None)
    assert ranks.main(["--layouts=1x1,2x1"]) == 2
    assert capsys.readouterr().err == "error: layouts with several ranks need mpiexec and mpi4py: pip install -e .[mpi]\n"


def test_a_failed_ranks_job_is_one_line(capsys, monkeypatch):
    from nanospa.bench import ranks
    monkeypatch.setattr(ranks.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 137, "", "Killed"))
    assert ranks.main(["--layouts=1x1", "--config=tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "failed (137): Killed" in err and err.count("\n") == 1
