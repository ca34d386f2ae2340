"""The commands on device "cuda", on the CuPy stand-in (tests/cupy_standin on PYTHONPATH of a
fresh process, so `import cupy` finds it): train.py fresh, resumed, with K-FAC and with
gradient accumulation; sample.py; the benchmark; an experiment's cell; the GPU check's dry
run; and every GPU command the README and docs show. Each process writes the stand-in's
counts of device reads and host copies (CUPY_STANDIN_COUNTS), and a training step's are
checked here as tests/test_gpu.py checks them in-process.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import standin_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the model attention layer kernel signal deep network without shortcuts token sequence".split()
TINY = ["--n_layer=2", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--eval_iters=2",
        "--warmup_iters=2", "--sample_tokens=0", "--device=cuda"]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(" ".join(np.random.default_rng(0).choice(WORDS, size=1200)) + "\n", encoding="utf-8")
    return path


def run(tmp_path, *args, counts="counts.json", timeout=300, **env):
    """A fresh process on the stand-in -> (CompletedProcess, the stand-in's counts)."""
    path = tmp_path / counts
    p = subprocess.run([sys.executable, *map(str, args)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=timeout, env=standin_env(NANOSPA_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
                                                        OPENBLAS_NUM_THREADS="1", CUPY_STANDIN_COUNTS=str(path), **env))
    assert p.returncode == 0, p.stderr[-3000:]
    return p, json.loads(path.read_text())


def train(tmp_path, text_file, *extra, out="out", counts="counts.json"):
    return run(tmp_path, ROOT / "train.py", *TINY, f"--data={text_file}", f"--out_dir={tmp_path / out}", *extra,
               counts=counts)


def read_log(folder):
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


def test_train_on_the_device_reads_and_copies_once_per_step(tmp_path, text_file):
    """train.py on "cuda": four more steps of the same run cost four reads (the loss and the
    gradient norm together) and four copies (the batch), whatever else the run does."""
    p, short = train(tmp_path, text_file, "--max_iters=3", "--log_interval=1", out="a", counts="a.json")
    assert "on cuda" in p.stdout and "done: iter 3" in p.stdout
    _, long = train(tmp_path, text_file, "--max_iters=7", "--log_interval=1", out="b", counts="b.json")
    assert (long["reads"] - short["reads"], long["copies"] - short["copies"]) == (4, 4)
    step = [s for s in long["read_sites"] if "nanospa/run/step.py:" in s]
    assert len(step) == 1 and long["read_sites"][step[0]] - short["read_sites"][step[0]] == 4


def test_resume_on_the_device_continues_step_for_step(tmp_path, text_file):
    """6 steps in one go, and 3 then --init_from=resume to 6: the same log and weights, bit for bit."""
    train(tmp_path, text_file, "--max_iters=6", "--eval_interval=3", out="whole")
    train(tmp_path, text_file, "--max_iters=3", "--eval_interval=3", "--lr_decay_iters=6", out="parts")
    train(tmp_path, text_file, "--max_iters=6", "--eval_interval=3", "--init_from=resume", out="parts")
    strip = lambda log: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in log]
    assert strip(read_log(tmp_path / "whole")) == strip(read_log(tmp_path / "parts"))
    with np.load(tmp_path / "whole" / "ckpt.npz") as a, np.load(tmp_path / "parts" / "ckpt.npz") as b:
        for k in a.files:
            if k not in ("state", "settings"):           # settings: out_dir and init_from differ
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("extra", [["--optimizer=kfac", "--kfac_inv_interval=2"], ["--grad_accum=2"],
                                   ["--attention_impl=blockwise", "--attention_block=8", "--pos=alibi",
                                    "--attention=softmax"], ["--norm=prepbn", "--residual=standard", "--norm_causal=True"]],
                         ids=["kfac", "grad_accum", "blockwise_alibi", "prepbn"])
def test_train_variants_on_the_device(tmp_path, text_file, extra):
    """K-FAC, gradient accumulation, blockwise attention with ALiBi and PRepBN train on the
    device, and a step's reads stay one (copies: one per micro-batch, K-FAC two more)."""
    _, short = train(tmp_path, text_file, "--max_iters=4", *extra, out="a", counts="a.json")
    _, long = train(tmp_path, text_file, "--max_iters=6", *extra, out="b", counts="b.json")
    copies = {"kfac": 3, "grad_accum": 2}.get(next((k for k in ("kfac", "grad_accum") if any(k in e for e in extra)), ""), 1)
    assert long["reads"] - short["reads"] == 2
    assert long["copies"] - short["copies"] == 2 * copies
    assert read_log(tmp_path / "b")[-1]["iter"] == 6


def test_sample_on_the_device(tmp_path, text_file):
    train(tmp_path, text_file, "--max_iters=2")
    p, _ = run(tmp_path, ROOT / "sample.py", f"--out_dir={tmp_path / 'out'}", "--device=cuda", "--num_samples=2",
               "--max_new_tokens=12", "--start=the ")
    assert p.stdout.count("--- sample") == 2


def test_the_benchmark_on_the_device(tmp_path):
    p, counts = run(tmp_path, "-m", "nanospa.bench", "--config=tiny", "--device=cuda", "--steps=2", "--warmup=1",
                    "--torch=no", "--gemm_n=128", "--json=True")
    out = json.loads(p.stdout)
    row = out["results"][0]
    assert out["machine"]["gpu"].startswith("CuPy stand-in") and row["device"] == "cuda"
    assert row["frameworks"]["nanospa"]["tokens_per_s"] > 0


def test_an_experiment_cell_on_the_device(tmp_path):
    p, _ = run(tmp_path, "-m", "nanospa.experiments", "fig2", "--preset=tiny", "--device=cuda", "--methods=espa",
               f"--out={tmp_path / 'fig2'}")
    result = json.loads((tmp_path / "fig2" / "result.json").read_text())
    assert result["settings"]["device"] == "cuda" and result["methods"]["espa"]


def test_the_gpu_check_dry_runs_on_the_stand_in(tmp_path):
    """python -m nanospa.bench.gpu_check --dry_run: every stage at toy sizes, on the stand-in
    with two GPUs (the nccl stage runs where mpiexec is: the mpi extra, as in CI)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    p, _ = run(tmp_path, "-m", "nanospa.bench.gpu_check", "--dry_run=True", f"--out={tmp_path / 'check'}", timeout=600,
               CUPY_STANDIN_DEVICES="2", PATH=path)
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["dry_run"] and report["device"].startswith("CuPy stand-in")
    for name, stage in report["stages"].items():
        assert stage["status"] in ("ok", "skipped"), (name, stage)
    for name in ("tests", "parity", "train", "bench", "lr"):
        assert report["stages"][name]["status"] == "ok", name
    if shutil.which("mpiexec", path=path):
        assert report["stages"]["nccl"]["status"] == "ok" and report["stages"]["nccl"]["max_error"] == 0.0
    assert (tmp_path / "check" / "report.md").is_file()


def _doc_commands():
    """Every command line in README.md and docs/*.md that runs on a GPU: (file, command)."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip().startswith("```"):
                fenced = not fenced
                continue
            if not (fenced or line.startswith("    ")):      # code: indented or fenced, not prose
                continue
            cmd = line.strip().split("   #")[0].strip()
            if re.match(r"^(mpiexec .*)?python ", cmd) and re.search(r"cuda|preset=gpu|gpu_check|\[gpu\]", cmd):
                out.append((path.name, cmd))
    return out


SHRINK = {"train.py": ["--max_iters=2", "--n_layer=2", "--n_embd=16", "--n_head=2", "--block_size=16",
                       "--batch_size=2", "--eval_iters=1", "--sample_tokens=0", "--warmup_iters=1"],
          "sample.py": ["--max_new_tokens=4", "--num_samples=1"],
          "nanospa.bench": ["--config=tiny", "--steps=1", "--warmup=1", "--torch=no", "--gemm_n=64", "--no_memory=True"],
          "nanospa.bench.gpu_check": ["--dry_run=True", "--stages=parity"],   # every stage: the dry-run test above
          "nanospa.experiments": ["--preset=tiny"]}


def test_the_docs_show_gpu_commands():
    assert len(_doc_commands()) >= 3, _doc_commands()


@pytest.mark.parametrize("source,command", _doc_commands())
def test_every_gpu_command_in_the_docs_runs_on_the_stand_in(tmp_path, text_file, source, command):
    """Each GPU command the docs show, as written, with settings that shrink it appended (a
    later --key wins), on the stand-in: a command that names a missing file, module or
    setting fails here."""
    words = shlex.split(command)
    if words[0] == "mpiexec":
        pytest.skip("mpiexec lines: tests/test_distributed.py runs them on the CPU")
    args = words[1:]
    target = args[1] if args[0] == "-m" else args[0]
    shrink = SHRINK.get(target, [])
    if target == "train.py":
        shrink = shrink + [f"--data={text_file}"]
    if args[1:3] == ["nanospa.experiments", "recipes"]:   # its presets are nanoGPT's: shrunk by its settings
        shrink = ["--max_iters=2", "--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=2",
                  "--eval_iters=1", "--seeds=1", f"--data={text_file}"]
    if target == "sample.py":
        train(tmp_path, text_file, "--max_iters=1", out="out")
        shrink = shrink + [f"--out_dir={tmp_path / 'out'}"]
    args = [str(ROOT / a) if a.endswith(".py") and (ROOT / a).is_file() else a for a in args]
    run(tmp_path, *args, *shrink, timeout=600)
