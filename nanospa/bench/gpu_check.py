"""python -m nanospa.bench.gpu_check [--out=DIR] [--budget_s=570] [--dry_run=True]: the GPU path
checked on a machine with a GPU, in under ten minutes, in one command.

No development machine of this project has a GPU; on the CPU the GPU path is checked by the
strict CuPy stand-in (tests/cupy_standin, tests/test_gpu*.py). What only a GPU can show is
here, stage by stage, each time-boxed (a stage that would not fit in what is left of the
budget is skipped and says so):

    tests    the GPU tests, for real: python -m pytest tests/test_backend_cuda.py (whole models
             of every variant and the fused ops, CPU against GPU; needs the checkout's tests/)
    parity   vanilla E-SPA and Pre-LN, 4 layers, width 128, T 64: logits, loss and every
             gradient on the GPU against the CPU, in float64 and float32 (CuPy's default: no
             TF32): the largest differences, relative to each quantity's largest entry
    train    python train.py --preset=gpu --max_iters=200: its log, tokens/s, the losses
    bench    one training step at the gpu preset (36 x 512, T 256, batch 32) and at T 2048
             (batch 4): nanospa float32 beside PyTorch float32, TF32 and bfloat16 autocast,
             all with scaled_dot_product_attention; medians of alternating rounds
    nccl     mpiexec -n 2: World.allreduce_grads through NCCL against the mean on the host
             (needs two GPUs, mpi4py and mpiexec: the mpi extra)
    lr       train.py --preset=gpu for --lr_steps steps at 2e-5, 4e-5, 8e-5 and 1.6e-4: the
             losses beside the width study's prediction (docs/results.md: best at 2e-5 or
             4e-5, worse at 8e-5, failing at 1.6e-4); a short sweep, warm-up lr_steps / 5

It writes DIR/report.json (every figure, the machine, the date and the commit) and
DIR/report.md (the table to paste into README and docs/performance.md, dated), and each
stage's log beside them; it prints each stage's line as it ends. --dry_run=True runs every
stage at toy sizes: on the stand-in that is a CI test (tests/test_gpu_commands.py).
Exit status: 0 when no stage failed, 1 when one did (its line says what), 2 for bad settings.
"""
import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .. import backend
from ..run.settings import SettingsError, fail, help_text, parse_settings, source_notes, wants_help

ROOT = Path(__file__).resolve().parents[2]      # the checkout: train.py, tests/
DEFAULTS = dict(
    out="out/gpu_check",   # folder for report.json, report.md and the stages' logs
    budget_s=570.0,        # seconds for every stage together (the device machines lend 10 minutes a call)
    dry_run=False,         # every stage at toy sizes (seconds; on the CuPy stand-in in CI)
    stages="tests,parity,train,bench,nccl,lr",   # which stages, in this order
    train_steps=200,       # train stage: steps of --preset=gpu
    lr_steps=150,          # lr stage: steps per learning rate
    bench_steps=10,        # bench stage: timed steps per row (after 3 untimed)
)
STAGES = ("tests", "parity", "train", "bench", "nccl", "lr")
PLANNED_S = dict(tests=60, parity=30, train=120, bench=120, nccl=30, lr=240)   # skipped when less is left
LRS = (2e-5, 4e-5, 8e-5, 1.6e-4)
PREDICTED_BEST = (2e-5, 4e-5)                   # docs/results.md, "How the learning rate scales"
TINY_MODEL = ["--n_layer=2", "--n_embd=32", "--n_head=2", "--block_size=16", "--batch_size=2", "--eval_iters=1"]


# ----------------------------------------------------------------------------- the machine

def machine():
    cp = backend.cupy()
    info = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), commit=_commit(),
                python=sys.version.split()[0], numpy=np.__version__)
    if backend.cuda_available():
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        info.update(gpu=name.decode() if isinstance(name, bytes) else str(name), cupy=cp.__version__,
                    gpus=cp.cuda.runtime.getDeviceCount(), cuda_runtime=cp.cuda.runtime.runtimeGetVersion(),
                    cuda_driver=cp.cuda.runtime.driverGetVersion())
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    return info


def _commit():
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _run(cmd, log, timeout, env=None):
    """A command of a stage, its output to `log` -> (exit status or None on timeout, seconds)."""
    t = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                env=dict(os.environ, **(env or {}))).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return rc, time.perf_counter() - t


def _tail(log, n=3):
    lines = Path(log).read_text(encoding="utf-8", errors="replace").strip().splitlines()
    return " | ".join(line.strip() for line in lines[-n:])[-400:]


# ----------------------------------------------------------------------------- stages

def stage_tests(s, out, timeout):
    tests = ROOT / "tests" / "test_backend_cuda.py"
    if not tests.is_file():
        return dict(status="skipped", why="no tests/ here: run from a checkout of the repository")
    log = out / "tests.log"
    rc, sec = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)], log, timeout)
    return dict(status="ok" if rc == 0 else "failed", seconds=round(sec, 1), summary=_tail(log, 1),
                log=log.name)


def _relative(a, b):
    scale = float(np.abs(b).max()) or 1.0
    return float(np.abs(a - b).max()) / scale


def _one_side(cfg, device, x, y):
    from ..model import GPT
    backend.use(device)
    model = GPT(cfg, seed=0)
    logits, loss = model(x, y)
    loss.backward()
    grads = {n: backend.to_numpy(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    out = backend.to_numpy(logits.data), float(loss.data), grads
    backend.use("cpu")
    return out


def stage_parity(s, out, timeout):
    from ..config import GPTConfig
    size = dict(n_layer=2, n_embd=16, n_head=2, block_size=16) if s["dry_run"] else \
        dict(n_layer=4, n_embd=128, n_head=4, block_size=64)
    models = dict(espa={}, pre_ln=dict(attention="softmax", residual="standard", norm="layernorm", pos="learned",
                                       activation="gelu"))
    bounds = dict(float64=1e-10, float32=1e-3)  # float64: another summation order only; float32: + its rounding
    rows, ok = [], True
    rng = np.random.default_rng(0)
    for dtype, bound in bounds.items():
        for name, kw in models.items():
            cfg = GPTConfig(vocab_size=256, dtype=dtype, **size, **kw)
            x = rng.integers(0, 256, (4, cfg.block_size))
            y = rng.integers(0, 256, (4, cfg.block_size))
            cpu, gpu = _one_side(cfg, "cpu", x, y), _one_side(cfg, "cuda", x, y)
            row = dict(model=name, dtype=dtype, logits=_relative(gpu[0], cpu[0]),
                       loss=abs(gpu[1] - cpu[1]) / abs(cpu[1]),
                       grads=max(_relative(gpu[2][k], cpu[2][k]) for k in cpu[2]), bound=bound)
            row["ok"] = max(row["logits"], row["loss"], row["grads"]) <= bound
            ok = ok and row["ok"]
            rows.append(row)
    return dict(status="ok" if ok else "failed", rows=rows)


def _train_cmd(s, out_dir, *extra):
    cmd = [sys.executable, str(ROOT / "train.py"), "--preset=gpu", f"--out_dir={out_dir}", "--overwrite=True", *extra]
    if s["dry_run"]:
        cmd += TINY_MODEL + ["--warmup_iters=1"]
    return cmd


def _read_log(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def stage_train(s, out, timeout):
    steps = 4 if s["dry_run"] else s["train_steps"]
    folder, log = out / "train", out / "train.log"
    rc, sec = _run(_train_cmd(s, folder, f"--max_iters={steps}", f"--eval_interval={max(1, steps // 2)}",
                              f"--checkpoint_interval={steps}", "--sample_tokens=200"), log, timeout)
    if rc != 0:
        return dict(status="failed", seconds=round(sec, 1), why=f"exit status {rc}: {_tail(log)}", log=log.name)
    records = _read_log(folder / "log.jsonl")
    speeds = [r["tokens_per_s"] for r in records if r.get("iter", 0) > 0 and "tokens_per_s" in r]
    evals = [r for r in records if "val_loss" in r]
    return dict(status="ok", seconds=round(sec, 1), steps=steps, tokens_per_s=statistics.median(speeds),
                final=dict(iter=evals[-1]["iter"], train=evals[-1]["train_loss"], val=evals[-1]["val_loss"]),
                evals=[(r["iter"], r["val_loss"]) for r in evals], log=log.name,
                run=f"{folder.name}/log.jsonl")


PRECISIONS = ("float32", "tf32", "bf16")


def _torch_row(torch, model, x, y, precision, device):
    """A PyTorch training step of the yardstick (yardstick.py) in one precision: float32
    (no TF32), TF32 matmuls, or bfloat16 autocast; -> a callable timing one step."""
    from . import yardstick
    from .measure import OPTIM
    trainer = yardstick.Trainer(yardstick.TorchGPT(yardstick.export_nanospa(model), device), x, y, OPTIM, device)
    kind = "cuda" if device == "cuda" else "cpu"

    def step():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
        trainer.sync()
        t = time.perf_counter()
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=precision == "bf16"):
            _, loss = trainer.run(trainer.idx, trainer.targets)
        loss.backward()
        trainer.opt.step()
        trainer.opt.zero_grad(set_to_none=True)
        trainer.sync()
        return time.perf_counter() - t
    return step


def stage_bench(s, out, timeout):
    from ..config import GPTConfig
    from ..model import GPT
    from .measure import NanospaStep, make_batch
    try:
        import torch
    except ImportError:
        torch = None
    if s["dry_run"]:
        shapes = dict(preset=(dict(n_layer=2, n_embd=32, n_head=2, block_size=16), 2),
                      long=(dict(n_layer=2, n_embd=32, n_head=2, block_size=64, attention_impl="blockwise",
                                 attention_block=16), 1))
        steps, warmup = 2, 1
    else:
        shapes = dict(preset=(dict(n_layer=36, n_embd=512, n_head=8, block_size=256), 32),
                      long=(dict(n_layer=36, n_embd=512, n_head=8, block_size=2048), 4))
        steps, warmup = s["bench_steps"], 3
    torch_device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    rows, started = [], time.perf_counter()
    for name, (kw, batch) in shapes.items():
        if time.perf_counter() - started > timeout:
            rows.append(dict(shape=name, skipped="budget"))
            continue
        cfg = GPTConfig(vocab_size=256, **kw)
        backend.use("cuda")
        model = GPT(cfg, seed=0)
        x, y = make_batch(cfg, batch)
        runners = [("nanospa", NanospaStep(model, x, y))]
        if torch is not None:
            runners += [(f"pytorch_{p}", _torch_row(torch, model, x, y, p, torch_device)) for p in PRECISIONS]
        times = {n: [] for n, _ in runners}
        for i in range(warmup + steps):
            for n, r in (runners if i % 2 == 0 else runners[::-1]):
                t = r()
                if i >= warmup:
                    times[n].append(t)
        tokens = batch * cfg.block_size
        row = dict(shape=name, T=cfg.block_size, batch=batch, layers=cfg.n_layer, width=cfg.n_embd,
                   torch_device=torch_device if torch is not None else None,
                   ms={n: 1e3 * statistics.median(t) for n, t in times.items()},
                   tokens_per_s={n: tokens / statistics.median(t) for n, t in times.items()})
        row["ratio"] = {n: row["ms"][n] / row["ms"]["nanospa"] for n in row["ms"] if n != "nanospa"}
        rows.append(row)
        backend.use("cpu")
    status = "ok" if any("ms" in r for r in rows) else "skipped"
    return dict(status=status, rows=rows, torch=None if torch is None else torch.__version__,
                note=None if torch is not None else "PyTorch not installed: nanospa's rows only (pip install torch)")


def stage_nccl(s, out, timeout):
    if shutil.which("mpiexec") is None:
        return dict(status="skipped", why="no mpiexec (pip install -e .[mpi])")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return dict(status="skipped", why="no mpi4py (pip install -e .[mpi])")
    cp = backend.cupy()
    if cp.cuda.runtime.getDeviceCount() < 2:
        return dict(status="skipped", why="one GPU: NCCL needs one device per rank")
    log, result = out / "nccl.log", out / "nccl.json"
    rc, sec = _run(["mpiexec", "-n", "2", sys.executable, "-m", "nanospa.bench.gpu_check", "--stages=nccl_rank",
                    f"--out={out}"], log, timeout)
    if rc != 0 or not result.is_file():
        return dict(status="failed", why=f"exit status {rc}: {_tail(log)}", log=log.name)
    return dict(status="ok" if json.loads(result.read_text())["ok"] else "failed", seconds=round(sec, 1),
                **json.loads(result.read_text()))


def nccl_rank(out):
    """One rank of the nccl stage: gradients that differ per rank, summed through NCCL."""
    from ..nn import Parameter
    from ..run.distributed import world
    w = world()
    w.use_device("cuda")
    backend.use("cuda")
    rng = np.random.default_rng(0)
    shapes = [(513, 257), (7,), (4096, 64)]
    host = [[rng.standard_normal(sh).astype(np.float32) for sh in shapes] for _ in range(w.size)]
    params = [Parameter(np.zeros(sh), dtype="float32") for sh in shapes]
    for p, g in zip(params, host[w.rank]):
        p.grad = backend.asarray(g)
    t = time.perf_counter()
    w.allreduce_grads(params)
    backend.synchronize()
    seconds = time.perf_counter() - t
    err = max(float(np.abs(backend.to_numpy(p.grad) - sum(h[i] for h in host) / w.size).max())
              for i, p in enumerate(params))
    if w.is_main:
        Path(out, "nccl.json").write_text(json.dumps(dict(ranks=w.size, max_error=err, ok=err < 1e-6,
                                                         elements=sum(int(np.prod(sh)) for sh in shapes),
                                                         allreduce_s=seconds, device=backend.cupy().cuda.get_device_id())))
    return 0


def stage_lr(s, out, timeout):
    steps = 2 if s["dry_run"] else s["lr_steps"]
    rows, started = [], time.perf_counter()
    for lr in LRS:
        left = timeout - (time.perf_counter() - started)
        if left < (0 if s["dry_run"] else timeout / (len(LRS) + 1)):
            rows.append(dict(lr=lr, skipped="budget"))
            continue
        folder, log = out / f"lr_{lr:g}", out / f"lr_{lr:g}.log"
        rc, sec = _run(_train_cmd(s, folder, f"--learning_rate={lr}", f"--min_lr={lr / 10}", f"--max_iters={steps}",
                                  f"--warmup_iters={max(1, steps // 5)}", f"--eval_interval={steps}",
                                  f"--checkpoint_interval={steps}", "--sample_tokens=0"), log, left)
        if rc not in (0, 1):
            rows.append(dict(lr=lr, failed=f"exit status {rc}: {_tail(log)}"))
            continue
        records = _read_log(folder / "log.jsonl") if (folder / "log.jsonl").is_file() else []
        evals = [r for r in records if "val_loss" in r and r["iter"] > 0]
        rows.append(dict(lr=lr, diverged=rc == 1, seconds=round(sec, 1),
                         val=evals[-1]["val_loss"] if evals else None, train=evals[-1]["train_loss"] if evals else None))
    done = [r for r in rows if r.get("val") is not None and math.isfinite(r["val"])]
    verdict = None
    if len(done) >= 2:
        best = min(done, key=lambda r: r["val"])["lr"]
        verdict = dict(best=best, predicted=list(PREDICTED_BEST), holds=best in PREDICTED_BEST)
    failed = [r for r in rows if "failed" in r]
    return dict(status="failed" if failed else "ok" if done else "skipped", steps=steps, rows=rows, verdict=verdict)


STAGE_FUNCTIONS = dict(tests=stage_tests, parity=stage_parity, train=stage_train, bench=stage_bench,
                       nccl=stage_nccl, lr=stage_lr)


# ----------------------------------------------------------------------------- the report

def _fmt(v, digits=3):
    return "-" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def report_md(report):
    m = report["machine"]
    lines = [f"GPU check {m['date']}, commit {m.get('commit') or '?'}: {m.get('gpu', 'no GPU')}, CuPy "
             f"{m.get('cupy', '-')}, CUDA runtime {m.get('cuda_runtime', '-')}, PyTorch {m.get('torch') or '-'}"
             + (" (dry run: toy sizes)" if report["dry_run"] else ""), ""]
    for name, st in report["stages"].items():
        head = f"- {name}: {st['status']}" + (f" ({st['why']})" if st.get("why") else "")
        lines.append(head)
        if name == "parity" and "rows" in st:
            for r in st["rows"]:
                lines.append(f"  - {r['model']} {r['dtype']}: logits {r['logits']:.2g}, loss {r['loss']:.2g}, "
                             f"gradients {r['grads']:.2g} (bound {r['bound']:g})")
        if name == "train" and st["status"] == "ok":
            lines.append(f"  - {st['steps']} steps in {st['seconds']:.0f} s, {st['tokens_per_s']:,.0f} tokens/s; "
                         f"iter {st['final']['iter']}: train {st['final']['train']:.4f}, val {st['final']['val']:.4f}")
        if name == "bench":
            for r in st.get("rows", []):
                if "ms" in r:
                    cells = ", ".join(f"{n} {r['ms'][n]:.1f} ms ({r['tokens_per_s'][n]:,.0f} tok/s)" for n in r["ms"])
                    lines.append(f"  - {r['shape']} (L {r['layers']}, C {r['width']}, T {r['T']}, B {r['batch']}): {cells}")
        if name == "nccl" and st["status"] != "skipped" and "max_error" in st:
            lines.append(f"  - {st['ranks']} ranks: all-reduce of {st.get('elements', '?')} gradients' entries, "
                         f"largest error {st['max_error']:.2g}, {1e3 * st['allreduce_s']:.1f} ms")
        if name == "lr":
            for r in st.get("rows", []):
                lines.append(f"  - lr {r['lr']:g}: " + ("skipped (budget)" if r.get("skipped") else
                                                         r.get("failed") or f"val {_fmt(r.get('val'), 4)}"
                                                         + (" (diverged)" if r.get("diverged") else "")))
            if st.get("verdict"):
                v = st["verdict"]
                lines.append(f"  - best {v['best']:g}; predicted {' or '.join(f'{x:g}' for x in v['predicted'])}: "
                             + ("holds" if v["holds"] else "does not hold"))
    return "\n".join(lines) + "\n"


def check(argv):
    s = parse_settings(argv, DEFAULTS)
    s.pop("_explicit")
    if s["stages"] == "nccl_rank":                    # a rank of the nccl stage (under mpiexec)
        return nccl_rank(s["out"])
    stages = [x for x in s["stages"].split(",") if x]
    bad = [x for x in stages if x not in STAGES]
    if bad or not stages:
        raise SettingsError(f"--stages: {', '.join(bad) or 'none given'} not among {', '.join(STAGES)}")
    if not s["budget_s"] > 0:
        raise SettingsError(f"--budget_s must be > 0, got {s['budget_s']}")
    for key in ("train_steps", "lr_steps", "bench_steps"):
        if s[key] < 1:
            raise SettingsError(f"--{key} must be >= 1, got {s[key]}")
    if not backend.cuda_available():
        raise SettingsError("no GPU: CuPy with a GPU is needed (pip install -e .[gpu]); on a CPU the GPU path is "
                            "checked by the tests' CuPy stand-in (tests/test_gpu.py)")
    out = Path(s["out"]).resolve()              # the stages run from the checkout
    out.mkdir(parents=True, exist_ok=True)
    report = dict(machine=machine(), dry_run=s["dry_run"], settings=s, stages={})
    report["device"] = report["machine"].get("gpu", "")
    print(f"gpu_check: {report['device']}, budget {s['budget_s']:.0f} s" + (" (dry run)" if s["dry_run"] else ""))
    start = time.perf_counter()
    for name in stages:
        left = s["budget_s"] - (time.perf_counter() - start)
        if left < (1 if s["dry_run"] else PLANNED_S[name] / 2):
            result = dict(status="skipped", why=f"budget: {left:.0f} s left")
        else:
            t = time.perf_counter()
            try:
                result = STAGE_FUNCTIONS[name](s, out, left)
            except Exception as e:                       # noqa: BLE001 -- a failed stage is a line, the others go on
                result = dict(status="failed", why=f"{type(e).__name__}: {e}"[:400])
            result.setdefault("seconds", round(time.perf_counter() - t, 1))
        report["stages"][name] = result
        print(f"  {name}: {result['status']}" + (f" ({result['why']})" if result.get("why") else "")
              + f" [{result.get('seconds', 0):.0f} s]", flush=True)
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(report_md(report))
    print(report_md(report))
    print(f"wrote {out / 'report.json'}, {out / 'report.md'}")
    return 1 if any(st["status"] == "failed" for st in report["stages"].values()) else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(help_text(__doc__.splitlines()[0], DEFAULTS, source_notes(__file__)))
        return 0
    try:
        return check(argv)
    except SettingsError as e:
        return fail(e)


if __name__ == "__main__":
    sys.exit(main())
