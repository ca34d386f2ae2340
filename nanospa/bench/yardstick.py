"""The PyTorch yardstick of ``python -m nanospa.bench``: the same GPT, written as a PyTorch user writes it.

This is a measuring stick only. It is not part of nanospa's model, it is never used for
training, and PyTorch is never a dependency: ``nanospa.bench`` imports this file only when
``import torch`` works. It exists so that a nanospa training step can be timed beside the
step of a mainstream framework doing exactly the same arithmetic on the same machine, and
a fair yardstick is a fast one: the model below is what a PyTorch user writes (nanoGPT's
layout), with each step through PyTorch's own fused kernel.

    wte, wpe          nn.Embedding (pos="learned"); pos="sinusoidal": a (T, C) buffer added
    c_attn, c_proj    nn.Linear, PyTorch's (out, in) weights: nanospa's W^Q, W^K, W^V (in, out)
                      transposed and stacked into one (3C, C) q|k|v layer, once, at construction
    attention         F.scaled_dot_product_attention, always: is_causal=True for softmax and
                      Value-SkipInit attention; with a fixed bias (U-SPA, E-SPA, pos="spa_prior")
                      the float mask tril(B_l) + causal (-inf above the diagonal) is a (T, T)
                      buffer built once per layer at construction
    D_l               a row scaling of SDPA's output: diag(D_l) (P V) = (diag(D_l) P) V
    Value-SkipInit    alpha V + beta SDPA(Q, K, V)
    phi_hat           s (phi(a x + b) + o) with phi PyTorch's fused op (F.leaky_relu(x, slope),
                      F.gelu, ...), each affine step skipped where it is the identity; for ReLU
                      and leaky ReLU with b = 0 and a > 0, phi(a x) = a phi(x): one product by s a
    norms             nn.LayerNorm / nn.RMSNorm (F.layer_norm / F.rms_norm) with nanospa's eps
    loss, optimiser   F.cross_entropy; torch.optim.AdamW(fused=True) where this torch has the
                      fused kernel (the fastest on CPU and GPU), else foreach=True, with
                      nanospa's hyper-parameters and its no-decay parameters

TorchGPT(model) copies a nanospa model's weights, buffers (B_l, D_l, positions) and the
numbers of its shaped activation: the yardstick recomputes none of nanospa's
signal-propagation maths, so every value of the fields that only change those numbers is
reproduced. tests/test_bench_torch.py checks, in float64, that its loss and every
parameter's gradient are nanospa's for the same weights, configuration by configuration.

check(cfg) refuses every other configuration with a ValueError naming the setting, so a
speed ratio is never reported between two different models: IMPLEMENTED lists the values it
implements of each GPTConfig field that changes the model's structure, COPIED the fields whose
every value it reproduces, and a field in neither is refused at any value but its default.

Also here, in PyTorch alone: Trainer (one timed training step, eager or torch.compile'd),
timed_rounds, and fresh_main, the entry of a fresh process that imports only torch and this
file (no nanospa, no NumPy threads settings) to time the yardstick alone
(measure.time_fresh). The module's top level imports nothing of nanospa for that reason:
what reads a nanospa model (check, export_nanospa) imports it inside.
"""
import dataclasses
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "float64": torch.float64}
SPA = ("uspa", "espa")
# GPTConfig field -> the values the yardstick implements (a field that changes the model's structure)
IMPLEMENTED = dict(
    attention=("softmax", "value_skipinit", "uspa", "espa"),
    residual=("none", "standard", "normalised", "deepnorm"),
    norm=("none", "layernorm", "rmsnorm"),
    norm_position=("pre", "post"),
    final_norm=("auto", "yes", "no"),
    pos=("none", "learned", "sinusoidal", "spa_prior"),
    dtype=("float32", "float64"),
    attention_impl=("auto", "dense", "blockwise"),   # the same maths: SDPA with the dense tril(B_l)
    bias=(False, True),
    zero_query=(False, True),                         # an initialisation: the weights are copied
    skipinit_per_head=(False, True),
    train_bias=(False,),                              # B_l trainable: no fixed mask buffer
    residual_attention=(False,),                      # RealFormer's carried scores: not in SDPA
    norm_causal=(False,),                             # only batchnorm, prepbn (refused) read it
)
# GPTConfig fields whose every value the yardstick reproduces: the sizes, and the fields that
# only change numbers it copies from the nanospa model (weights, B_l, D_l, phi_hat's constants)
COPIED = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "residual_beta",
          "kernel_budget", "gamma_final", "rho_final", "final_corr", "zeta", "eta", "tau", "shaping_depth",
          "attention_block", "norm_groups", "prepbn_steps", "prepbn_eta")   # the last three: refused norms only
# activation: every base of signal.activations.ACTIVATIONS with a PyTorch op here (shaped or plain)
SOFTPLUS_THRESHOLD = 40.0   # F.softplus returns x above it; exp(-40) is below float64's rounding of 40,
                            # so unlike the default 20 this is nanospa's log1p(exp(-|x|)) + max(x, 0)
PHI = {"relu": F.relu, "leaky_relu": F.leaky_relu, "gelu": lambda u: F.gelu(u, approximate="tanh"),
       "gelu_exact": F.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
       "softplus": lambda u: F.softplus(u, threshold=SOFTPLUS_THRESHOLD), "elu": F.elu, "swish": F.silu,
       "linear": None}
HOMOGENEOUS = ("relu", "leaky_relu")   # phi(a x) = a phi(x) for a > 0


def refusal(name, value, implemented=None):
    what = f" (it implements {list(implemented)})" if implemented is not None else \
        " (a GPTConfig field it does not know: only its default is accepted)"
    return ValueError(f"the PyTorch yardstick does not implement {name}={value!r}{what}: "
                      "no speed ratio for this model")


def check(cfg):
    """ValueError naming the first setting of cfg (a GPTConfig) this yardstick does not
    implement exactly."""
    from ..signal import split_activation
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "activation":
            base = split_activation(value)[0]
            if base not in PHI:
                raise refusal("activation", value, sorted(PHI))
        elif f.name in IMPLEMENTED:
            if value not in IMPLEMENTED[f.name]:
                raise refusal(f.name, value, IMPLEMENTED[f.name])
        elif f.name not in COPIED and value != f.default:
            raise refusal(f.name, value)


# ----------------------------------------------------------------------------- the model

class ShapedActivation(nn.Module):
    """phi_hat(x) = s (phi(a x + b) + o), nanospa's functions.Shaped, through PyTorch's op for
    phi; each affine step that is the identity is skipped (decided once, here)."""

    def __init__(self, base, a, b, s, o, slope=None):
        super().__init__()
        if base in HOMOGENEOUS and b == 0.0 and a > 0.0:
            a, s = 1.0, s * a                        # s phi(a x) = (s a) phi(x)
        self.base, self.a, self.b, self.s, self.o, self.slope = base, a, b, s, o, slope

    def forward(self, x):
        u = x * self.a if self.a != 1.0 else x
        u = u + self.b if self.b != 0.0 else u
        if self.base == "leaky_relu":
            y = F.leaky_relu(u, self.slope)
        elif self.base == "linear":
            y = u
        else:
            y = PHI[self.base](u)
        y = y + self.o if self.o != 0.0 else y
        return y * self.s if self.s != 1.0 else y

    def extra_repr(self):
        return f"{self.base}, a={self.a:.6g}, b={self.b:.6g}, s={self.s:.6g}, o={self.o:.6g}, slope={self.slope}"


class _RMSNorm(nn.Module):
    """nn.RMSNorm for a torch without it (< 2.4): x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(spec):
    C, eps = spec["n_embd"], spec["norm_eps"]
    if spec["norm"] == "layernorm":
        return nn.LayerNorm(C, eps=eps)
    if spec["norm"] == "rmsnorm":
        return nn.RMSNorm(C, eps=eps) if hasattr(nn, "RMSNorm") else _RMSNorm(C, eps)
    return None


class CausalSelfAttention(nn.Module):
    def __init__(self, spec, has_mask):
        super().__init__()
        C, T, bias = spec["n_embd"], spec["block_size"], spec["bias"]
        self.n_head, self.kind = spec["n_head"], spec["attention"]
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)          # q | k | v
        self.c_proj = nn.Linear(C, C, bias=bias)
        self.register_buffer("mask", torch.empty(T, T) if has_mask else None)   # tril(B_l) + causal mask
        self.register_buffer("D", torch.empty(T) if self.kind in SPA else None)
        if self.kind == "value_skipinit":
            shape = (self.n_head, 1, 1) if spec["skipinit_per_head"] else (1,)
            self.alpha, self.beta = nn.Parameter(torch.empty(shape)), nn.Parameter(torch.empty(shape))

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)              # (B, H, T, D)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        if self.mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:T, :T])
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.D is not None:
            y = y * self.D[:T, None]                              # row i times D_l[i]
        elif self.kind == "value_skipinit":
            y = self.alpha * v + self.beta * y
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, spec):
        super().__init__()
        C, M, bias = spec["n_embd"], spec["mlp_hidden"], spec["bias"]
        self.c_fc = nn.Linear(C, M, bias=bias)
        self.act = ShapedActivation(**spec["activation"])
        self.c_proj = nn.Linear(M, C, bias=bias)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, spec, has_mask):
        super().__init__()
        self.attn, self.mlp = CausalSelfAttention(spec, has_mask), MLP(spec)
        self.norm1, self.norm2 = make_norm(spec), make_norm(spec)
        self.residual, self.pre = spec["residual"], spec["norm_position"] == "pre"
        self.a, self.b = spec["residual_weights"]                # a x + b f(x): normalised, deepnorm

    def sublayer(self, x, f, norm):
        h = f(norm(x)) if norm is not None and self.pre else f(x)
        if self.residual == "standard":
            h = x + h
        elif self.residual in ("normalised", "deepnorm"):
            h = x * self.a + h * self.b
        return norm(h) if norm is not None and not self.pre else h

    def forward(self, x):
        x = self.sublayer(x, self.attn, self.norm1)
        return self.sublayer(x, self.mlp, self.norm2)


class TorchGPT(nn.Module):
    """nanospa's GPT (same configuration, same weights) as a PyTorch module. ``source``: a
    nanospa GPT (or its view.DenseView), or the dict export_nanospa made of one (its
    parameters are copied, its buffers shared). forward(idx, targets) -> (logits, loss)."""

    def __init__(self, source, device="cpu"):
        super().__init__()
        exported = source if isinstance(source, dict) else export_nanospa(source)
        spec, state = exported["spec"], exported["state"]
        self.spec = spec
        with torch.device("meta"):                               # no random init: the weights come next
            self.wte = nn.Embedding(spec["vocab_size"], spec["n_embd"])
            self.wpe = nn.Embedding(spec["block_size"], spec["n_embd"]) if spec["pos"] == "learned" else None
            sinusoidal = spec["pos"] == "sinusoidal"
            self.register_buffer("pe", torch.empty(spec["block_size"], spec["n_embd"]) if sinusoidal else None)
            self.blocks = nn.ModuleList(Block(spec, f"blocks.{i}.attn.mask" in state)
                                        for i in range(spec["n_layer"]))
            self.ln_f = make_norm(spec) if spec["final_norm"] else None
            self.head = nn.Linear(spec["n_embd"], spec["vocab_size"], bias=False)
        buffers = {name for name, _ in self.named_buffers()}
        self.load_state_dict({k: v.to(device) if k in buffers else v.to(device, copy=True)
                              for k, v in state.items()}, assign=True)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx)                                         # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        elif self.pe is not None:
            x = x + self.pe[:T]
        for block in self.blocks:
            x = block(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        logits = self.head(x)
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def param_groups(self, weight_decay):
        """AdamW groups as nanospa's AdamW makes them: no decay on nanospa's ``no_decay``
        parameters (biases, norm gains, alpha and beta)."""
        no_decay = set(self.spec["no_decay"])
        named = list(self.named_parameters())
        return [dict(params=[p for k, p in named if k not in no_decay], weight_decay=weight_decay),
                dict(params=[p for k, p in named if k in no_decay], weight_decay=0.0)]

    def nanospa_grads(self):
        """{nanospa parameter name: its gradient here, in nanospa's layout} (a torch tensor)."""
        params = dict(self.named_parameters())
        out = {}
        for name, tname, r0, r1, transposed in self.spec["layout"]:
            if tname in params:
                g = params[tname].grad
                g = g[r0:r1] if r0 is not None else g
                out[name] = g.T if transposed else g
        return out


# ----------------------------------------------------------------------------- from nanospa

def _torch_name(name):
    """nanospa state key -> (torch key, stacked piece of q|k|v or None, transposed)."""
    parts = name.split(".")
    if len(parts) == 5 and parts[2] == "attn" and parts[3] in ("q", "k", "v"):
        return ".".join(parts[:3] + ["c_attn", parts[4]]), "qkv".index(parts[3]), parts[4] == "weight"
    if len(parts) == 5 and parts[2:4] in (["attn", "proj"], ["mlp", "proj"], ["mlp", "fc"]):
        layer = "c_fc" if parts[3] == "fc" else "c_proj"
        return ".".join(parts[:3] + [layer, parts[4]]), None, parts[4] == "weight"
    if len(parts) == 4 and parts[2] == "attn" and parts[3] in ("alpha", "beta", "D"):
        return name, None, False
    if len(parts) == 4 and parts[2] == "attn" and parts[3] == "B":
        return ".".join(parts[:3] + ["mask"]), None, False
    if len(parts) == 4 and parts[2] in ("norm1", "norm2") or parts[0] in ("ln_f", "wte", "wpe") or name == "pe":
        return name, None, False
    if name == "head.weight":
        return name, None, True
    raise ValueError(f"the PyTorch yardstick does not know nanospa's tensor {name!r}: no speed ratio for this model")


def export_nanospa(model):
    """A nanospa GPT (or its view.DenseView, whose state has the dense B_l of a blockwise
    model) as dict(spec, state): the yardstick's plain settings and its state dict
    in PyTorch's layout and the model's dtype (on the host). check() first."""
    import numpy as np

    from .. import backend
    from ..signal.plan import residual_weights
    from ..fused import LAYER_NORM_EPS, RMS_NORM_EPS
    if hasattr(model, "blocks"):                                 # a GPT: a blockwise one keeps no dense B_l
        from .view import DenseView
        model = DenseView(model)
    cfg = model.config
    check(cfg)
    dt = DTYPES[cfg.dtype]
    flags = {k: p.no_decay for k, p in model.named_parameters()}
    h = model.activation.phi_hat                                 # model.ShapedActivation's PhiHat
    spec = dict(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                n_embd=cfg.n_embd, mlp_hidden=cfg.mlp_ratio * cfg.n_embd, bias=bool(cfg.bias),
                attention=cfg.attention, skipinit_per_head=bool(cfg.skipinit_per_head),
                residual=cfg.residual, residual_weights=tuple(float(w) for w in residual_weights(cfg)[:2]),
                norm=cfg.norm, norm_position=cfg.norm_position, final_norm=bool(cfg.uses_final_norm),
                norm_eps=dict(layernorm=LAYER_NORM_EPS, rmsnorm=RMS_NORM_EPS).get(cfg.norm), pos=cfg.pos,
                dtype=cfg.dtype, activation=dict(base=h.base, a=h.a, b=h.b, s=h.s, o=h.o, slope=h.negative_slope))
    T = cfg.block_size
    causal = torch.triu(torch.full((T, T), -math.inf, dtype=dt), 1)
    pieces, layout = {}, []
    state = model.state_dict()
    for name in state:
        tname, piece, transposed = _torch_name(name)
        a = torch.as_tensor(np.ascontiguousarray(backend.to_numpy(state[name])), dtype=dt)  # one layer's B_l at a time
        if name.endswith(".attn.B"):
            a = torch.tril(a) + causal                             # the float mask SDPA adds, built once
        a = a.T.contiguous() if transposed else a
        rows = a.shape[0] if piece is not None else None
        pieces.setdefault(tname, []).append((piece or 0, a))
        layout.append((name, tname, None if piece is None else piece * rows,
                       None if piece is None else (piece + 1) * rows, transposed))
    out = {}
    for tname, parts in pieces.items():
        parts.sort(key=lambda p: p[0])
        out[tname] = parts[0][1] if len(parts) == 1 else torch.cat([a for _, a in parts])
    decay = {}
    for name, tname, *_ in layout:
        if name in flags:
            decay.setdefault(tname, set()).add(flags[name])
    if any(len(v) > 1 for v in decay.values()):
        raise ValueError("the PyTorch yardstick stacks q, k, v: their weight decay must agree")
    spec["no_decay"] = sorted(t for t, v in decay.items() if True in v)
    spec["layout"] = layout
    return dict(spec=spec, state=out)


# ----------------------------------------------------------------------------- training steps

def make_adamw(model, optim):
    """torch.optim.AdamW over model.param_groups with nanospa's hyper-parameters (optim: lr,
    betas, weight_decay, eps): fused=True where this torch has the fused kernel for the
    parameters' device and dtype (the fastest: one kernel for all parameters), else
    foreach=True. -> (optimizer, "fused" | "foreach")."""
    groups = model.param_groups(optim["weight_decay"])
    kw = dict(lr=optim["lr"], betas=tuple(optim["betas"]), eps=optim.get("eps", 1e-8))
    try:
        return torch.optim.AdamW(groups, fused=True, **kw), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(model.param_groups(optim["weight_decay"]), foreach=True, **kw), "foreach"


class Trainer:
    """One training step of a TorchGPT, timed: forward, backward, AdamW, zero_grad. With
    ``compiled``, the model runs through torch.compile (inductor, static shapes; the optimiser
    is already one fused kernel): the first call, compile(), compiles it."""

    def __init__(self, model, idx, targets, optim, device, compiled=False):
        self.model, self.device, self.compiled = model, device, compiled
        self.opt, self.optimizer = make_adamw(model, optim)
        self.idx = torch.as_tensor(idx, device=device)
        self.targets = torch.as_tensor(targets, device=device)
        self.run = model
        if compiled:
            if hasattr(torch, "_dynamo"):
                torch._dynamo.reset()                # a fresh compile per model: no shape-generic graph
            self.run = torch.compile(model, dynamic=False)

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def __call__(self):
        self.sync()
        t = time.perf_counter()
        _, loss = self.run(self.idx, self.targets)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sync()
        return time.perf_counter() - t

    def compile(self):
        """Compile by one training step: -> (seconds, None), or (None, the reason in one line)
        when compilation fails on this machine."""
        try:
            return self(), None
        except Exception as e:                       # no C++ compiler, unsupported op, ...: a row, not a crash
            lines = str(e).strip().splitlines()
            first = next((line.strip() for line in lines if line.strip()), "")
            return None, f"{type(e).__name__}: {first}"[:300]


def timed_rounds(runners, steps, warmup, settle):
    """{name: [seconds]}: `warmup` untimed rounds, then `steps` timed ones, every runner once
    a round (alternating order), `settle` idle seconds before each timed call."""
    for _ in range(warmup):
        for _, r in runners:
            r()
    times = {name: [] for name, _ in runners}
    for i in range(steps):
        for name, r in (runners if i % 2 == 0 else runners[::-1]):
            time.sleep(settle)
            times[name].append(r())
    return times


def fresh_main(argv):
    """The fresh process of measure.time_fresh: ``JOB THREADS``, JOB a torch.save'd dict
    (export, idx, targets, optim, device, rows {name: compiled?}, steps, warmup, settle).
    Sets torch.set_num_threads(THREADS) first (its only thread setting), times the rows and
    prints one JSON line."""
    path, threads = argv[0], int(argv[1])
    torch.set_num_threads(threads)
    job = torch.load(path, weights_only=True)
    out = dict(rows={}, torch_threads=torch.get_num_threads(), torch=torch.__version__,
               nanospa_imported=any(m == "nanospa" or m.startswith("nanospa.") for m in sys.modules))
    runners = []
    for name, compiled in job["rows"].items():
        step = Trainer(TorchGPT(job["export"], job["device"]), job["idx"], job["targets"], job["optim"],
                       job["device"], compiled=compiled)
        row = out["rows"][name] = dict(optimizer=step.optimizer)
        if compiled:
            row["compile_s"], reason = step.compile()
            if reason is not None:
                row["unavailable"] = reason
                continue
        runners.append((name, step))
    for name, t in timed_rounds(runners, job["steps"], job["warmup"], job["settle"]).items():
        out["rows"][name]["times"] = t
    print(json.dumps(out))
    return 0
