"""The golden run: float64 behaviour of nanospa recorded before a refactoring, to be checked after it.

    python tests/golden.py --write     # record tests/golden.json (only when behaviour is meant to change)
    python tests/golden.py             # compare with tests/golden.json (what tests/test_golden.py does)

For each attention x residual x norm x norm_position variant (84) a small float64 GPT is
built and trained for a few AdamW steps: the losses and a parameter checksum (sum and sum of
squares of every parameter, the B_l and D_l buffers included) are recorded. For each
kernel-budget policy the plan's schedule and per-layer B_l, D_l checksums are recorded, and
the text of `python -m nanospa.signal` for a few configurations. A refactoring that is meant
to leave behaviour unchanged must reproduce all of it within TOLERANCES (the text word for
word, its numbers to the last printed digit).

The tolerances come from measurement, not from one machine (docs/decisions.md, "Tolerances
from measurement"): the record was made under every OpenBLAS kernel this machine can run
(OPENBLAS_CORETYPE=Prescott, Sandybridge, Haswell, Zen and its own SkylakeX) and with NumPy's
SIMD dispatch cut to its baseline (NPY_DISABLE_CPU_FEATURES="AVX512_ICL X86_V4 X86_V3"), and
the largest relative difference from the native record was, per quantity:

    losses              3.7e-13   (3 AdamW steps amplify the rounding of the first)
    params[0], a sum    7.4e-12   (of parameters of both signs: cancellation)
    params[1], sum sq   9.6e-13
    budgets             7.8e-15   (plans: closed forms and root finds, no BLAS on the path)

Each tolerance is about 100 times that. A semantic change still shows: moving the positions'
variance, AdamW's rate or the orthogonal weights' scale by 1e-9 relative moves some loss by
5e-10 to 7e-9 (tests/test_golden.py plants the first).
"""
import contextlib
import io
import itertools
import json
import math
import pathlib
import re
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOLDEN = pathlib.Path(__file__).with_name("golden.json")
TOLERANCES = {"losses": 1e-10, "params[0]": 1e-9, "params[1]": 1e-10, "budgets": 1e-12}   # see above
RTOL = 1e-12          # anything else recorded: plan numbers, checksums of B_l and D_l
TEXT_ATOL = 1e-13     # printed construction errors sit at the rounding level (~1e-16)
ATTENTIONS = ("softmax", "value_skipinit", "uspa", "espa")
RESIDUALS = ("none", "standard", "normalised")
NORMS = (("none", "pre"), ("layernorm", "pre"), ("layernorm", "post"), ("rmsnorm", "pre"),
         ("rmsnorm", "post"), ("dyt", "pre"), ("dyt", "post"))
BUDGET_CASES = [dict(attention=a, kernel_budget=b, residual=r)
                for a in ("espa", "uspa")
                for b in ("independent", "joint", "qpreserve", "mlp_aware", "joint_qpreserve")
                for r in ("none", "normalised") if not (b == "mlp_aware" and r != "none")]
SIGNAL_ARGS = [["--n_layer=6", "--block_size=16"],
               ["--n_layer=6", "--block_size=16", "--attention=uspa"],
               ["--n_layer=12", "--block_size=12", "--attention=softmax"],
               ["--n_layer=12", "--block_size=12", "--residual=normalised", "--norm=layernorm"],
               ["--n_layer=24", "--block_size=12", "--kernel_budget=qpreserve", "--pos=learned"],
               ["--n_layer=24", "--block_size=12", "--kernel_budget=mlp_aware", "--activation=dks_gelu"],
               ["--n_layer=12", "--block_size=12", "--attention=value_skipinit", "--activation=tat_gelu"],
               ["--n_layer=3", "--block_size=8", "--empirical=True", "--width=64", "--batch=2"]]
STEPS = 3


def checksum(arrays):
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    finite = [a[np.isfinite(a)] for a in arrays]
    return [float(sum(a.sum() for a in finite)), float(sum((a * a).sum() for a in finite))]


def model_runs():
    from nanospa import GPT, GPTConfig, AdamW
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 32, size=(2, 8))
    tgt = rng.integers(0, 32, size=(2, 8))
    out = {}
    for att, res, (norm, npos) in itertools.product(ATTENTIONS, RESIDUALS, NORMS):
        cfg = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16, attention=att,
                        residual=res, norm=norm, norm_position=npos, pos="learned", dtype="float64")
        model = GPT(cfg, seed=1)
        opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        losses = []
        for _ in range(STEPS):
            _, loss = model(idx, tgt)
            losses.append(float(loss.data))
            opt.zero_grad()
            loss.backward()
            opt.step()
        out[f"{att}/{res}/{norm}/{npos}"] = dict(losses=losses, params=checksum(model.state_dict().values()))
    return out


def plan_layers(plan, T):
    """[(B_l, D_l)] of a plan, whatever the plan's layout (recorded through the public accessor
    when it exists, else the layer dicts of the first design)."""
    from nanospa import signal
    if hasattr(signal, "dense_layer_bias"):
        return [signal.dense_layer_bias(plan, l, T) for l in range(1, len(plan.schedule))]
    return [(layer["B"], layer["D"]) for layer in plan.layers]


def plan_params(plan):
    """The shaped activation's parameters of a plan, whatever its layout."""
    return plan.params if hasattr(type(plan), "params") else plan.activation["params"]


def budget_runs():
    from nanospa import GPTConfig, signal
    out = {}
    for case in BUDGET_CASES:
        cfg = GPTConfig(n_layer=24, block_size=16, **case)
        try:
            plan = signal.make_plan(cfg)
        except ValueError as e:
            out["/".join(case.values())] = dict(error=str(e))
            continue
        layers = plan_layers(plan, cfg.block_size)
        info = {k: v for k, v in plan.info.items() if isinstance(v, float)}
        out["/".join(case.values())] = dict(
            info=info, B=checksum([np.tril(B) for B, _ in layers]), D=checksum([D for _, D in layers]),
            params=sorted((k, float(v)) for k, v in plan_params(plan).items()))
    return out


def signal_texts():
    from nanospa.signal.__main__ import main
    out = {}
    for args in SIGNAL_ARGS:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(list(args))
        out[" ".join(args)] = dict(rc=rc, text=buf.getvalue())
    return out


def record():
    return dict(models=model_runs(), budgets=budget_runs(), signal=signal_texts())


def tolerance(path):
    """The relative tolerance of a recorded number, by what it is (TOLERANCES)."""
    if path.startswith("/models"):
        for key, tol in TOLERANCES.items():
            if key in path.rsplit("/", 1)[-1]:
                return tol
    return TOLERANCES["budgets"] if path.startswith("/budgets") else RTOL


def differences(ref, new, path=""):
    """Every place where new differs from ref by more than its tolerance (numbers), or at all
    (text, apart from its numbers)."""
    if isinstance(ref, dict):
        diffs = [f"{path}: keys {sorted(set(ref) ^ set(new))}"] if set(ref) != set(new) else []
        for k in ref:
            if k in new:
                diffs += differences(ref[k], new[k], f"{path}/{k}")
        return diffs
    if isinstance(ref, (list, tuple)):
        if len(ref) != len(new):
            return [f"{path}: length {len(ref)} vs {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(ref, new)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(ref, float):
        tol = tolerance(path)
        if not math.isclose(ref, new, rel_tol=tol, abs_tol=tol):
            return [f"{path}: {ref!r} vs {new!r}"]
        return []
    if isinstance(ref, str) and isinstance(new, str):
        return _text_differences(ref, new, path)
    return [] if ref == new else [f"{path}: {ref!r} vs {new!r}"]


NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _last_digit(text):
    """The value of one unit in the last printed digit of a number's text (0 for an integer)."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals) if "." in mantissa or exponent else 0.0


def _text_differences(ref, new, path):
    """Texts must agree word for word except printed numbers, which may differ by one unit of
    their last printed digit (a value at a rounding boundary on one CPU and not on another),
    by RTOL, or by TEXT_ATOL (construction errors printed at the rounding level)."""
    if NUMBER.sub("#", ref) != NUMBER.sub("#", new):
        return [f"{path}: text differs:\n{ref}\n---\n{new}"]
    out = []
    for a, b in zip(NUMBER.findall(ref), NUMBER.findall(new)):
        if a != b and abs(float(a) - float(b)) > max(1.0001 * _last_digit(a), RTOL * abs(float(a)), TEXT_ATOL):
            out.append(f"{path}: printed {a} vs {b}")
    return out


def main(argv):
    new = record()
    if "--write" in argv:
        GOLDEN.write_text(json.dumps(new, indent=1) + "\n")
        print(f"wrote {GOLDEN}")
        return 0
    diffs = differences(json.loads(GOLDEN.read_text()), new)
    print("\n".join(diffs) if diffs else "golden run reproduced")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
