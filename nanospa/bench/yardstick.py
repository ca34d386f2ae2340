"""The PyTorch yardstick of ``python -m nanospa.bench``: the same GPT in PyTorch eager mode.

This is a measuring stick only. It is not part of nanospa's model, it is never used for
training, and PyTorch is never a dependency: ``nanospa.bench`` imports this file only when
``import torch`` works. It exists so that a nanospa training step can be timed beside the
step of a mainstream framework doing exactly the same arithmetic on the same machine.

"The same" means: built from a nanospa model's ``state_dict()`` (so the weights, the SPA
buffers B_l, D_l and the shaped activation's numbers are nanospa's), with the same block
structure as nanospa/model.py, written the way a PyTorch user would write it in eager mode
(a manual attention, as in nanoGPT's non-flash path: scores, + B_l, causal mask, softmax,
rows scaled by D_l, times V). tests/test_bench_torch.py checks that it gives nanospa's loss for
the same weights. ``sdpa=True`` swaps in torch's fused scaled_dot_product_attention
(B_l and the causal mask as one additive mask), for reference only; D_l scales the rows of
the attention output either way, since diag(D) (P V) = (diag(D) P) V.

Implemented: the values of IMPLEMENTED below, and every base activation of
signal.activations (PHI). check(cfg) refuses any other configuration with a line naming the
setting, so a speed ratio is never reported between two different models.

Not here: the timing (bench_measure.py), the command line (bench.py). Only nanospa's
modules import this file, and only after `import torch` has worked.
"""
import math

import torch
import torch.nn.functional as TF

from ..fused import LAYER_NORM_EPS, RMS_NORM_EPS   # nanospa's norms' eps, so both compute the same
from ..signal import split_activation

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
IMPLEMENTED = dict(attention=("softmax", "value_skipinit", "uspa", "espa"), residual=("none", "standard", "normalised"),
                   norm=("none", "layernorm", "rmsnorm"), pos=("none", "learned", "sinusoidal"),
                   residual_attention=(False,), bias=(False,))
PHI = {"relu": torch.relu, "gelu": lambda u: TF.gelu(u, approximate="tanh"), "gelu_exact": TF.gelu,
       "sigmoid": torch.sigmoid, "tanh": torch.tanh, "softplus": TF.softplus, "elu": TF.elu,
       "swish": TF.silu, "linear": lambda u: u}   # leaky_relu: TF.leaky_relu with the model's slope


def check(cfg):
    """ValueError naming the first setting of cfg this yardstick does not implement."""
    for key, values in IMPLEMENTED.items():
        if getattr(cfg, key) not in values:
            raise ValueError(f"the PyTorch yardstick does not implement {key}={getattr(cfg, key)!r} "
                             f"(it implements {list(values)}): no speed ratio for this model")
    if split_activation(cfg.activation)[0] not in {*PHI, "leaky_relu"}:
        raise ValueError(f"the PyTorch yardstick does not implement activation={cfg.activation!r}")


def _act(base, a, b, s, o, slope):
    """phi_hat(x) = s (phi(a x + b) + o), nanospa's functions.Shaped."""
    phi = (lambda u: TF.leaky_relu(u, slope)) if base == "leaky_relu" else PHI[base]

    def f(x):
        u = x * a if a != 1.0 else x
        u = u + b if b != 0.0 else u
        y = phi(u)
        y = y + o if o != 0.0 else y
        return y * s if s != 1.0 else y
    return f


class TorchGPT(torch.nn.Module):
    """nanospa's GPT (same config, same weights) in PyTorch eager mode. Linear weights keep
    nanospa's (in, out) layout: y = x @ W."""

    def __init__(self, model, device="cpu", sdpa=False):
        super().__init__()
        cfg = model.config
        check(cfg)
        self.cfg, self.sdpa = cfg, sdpa
        dt = _DTYPES[cfg.dtype]
        state = model.state_dict()
        self.params = torch.nn.ParameterDict()
        self.buffers_ = {}
        for k, v in state.items():
            t = torch.tensor(v, dtype=dt, device=device)
            if k in dict(model.named_parameters()):
                self.params[k.replace(".", "_")] = torch.nn.Parameter(t)
            else:
                self.buffers_[k] = t
        act = model.activation                      # model.ShapedActivation: the numbers of functions.Shaped
        opts = act.options
        self.act = _act(act.base, opts["a"], opts["b"], opts["s"], opts["o"], opts.get("slope"))
        T = cfg.block_size
        self.mask = torch.triu(torch.full((T, T), -math.inf, dtype=dt, device=device), 1)

    def p(self, name):
        key = name.replace(".", "_")
        return self.params[key] if key in self.params else self.buffers_[name]

    def has(self, name):
        return name.replace(".", "_") in self.params or name in self.buffers_

    def norm(self, x, prefix):
        cfg = self.cfg
        if cfg.norm == "layernorm":
            return TF.layer_norm(x, (cfg.n_embd,), self.p(prefix + ".weight"), self.p(prefix + ".bias"),
                                 LAYER_NORM_EPS)
        if cfg.norm == "rmsnorm":
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + RMS_NORM_EPS) * self.p(prefix + ".weight")
        return x

    def attention(self, x, i):
        cfg, pre = self.cfg, f"blocks.{i}.attn."
        B, T, C = x.shape
        H = cfg.n_head
        D = C // H
        q = (x @ self.p(pre + "q.weight")).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = (x @ self.p(pre + "k.weight")).view(B, T, H, D).transpose(1, 2)
        v = (x @ self.p(pre + "v.weight")).view(B, T, H, D).transpose(1, 2)
        spa = cfg.attention in ("uspa", "espa")
        if self.sdpa:
            mask = self.mask[:T, :T] + self.p(pre + "B")[:T, :T] if spa else None
            y = TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not spa)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D)) + self.mask[:T, :T]
            if spa:
                s = s + self.p(pre + "B")[:T, :T]
            y = torch.softmax(s, dim=-1) @ v                                  # (B, H, T, D)
        if spa:
            y = y * self.p(pre + "D")[:T, None]
        elif cfg.attention == "value_skipinit":
            y = v * self.p(pre + "alpha") + y * self.p(pre + "beta")
        y = y.transpose(1, 2).reshape(B, T, C)
        return y @ self.p(pre + "proj.weight")

    def mlp(self, x, i):
        pre = f"blocks.{i}.mlp."
        return self.act(x @ self.p(pre + "fc.weight")) @ self.p(pre + "proj.weight")

    def sublayer(self, x, f, prefix):
        cfg = self.cfg
        h = f(self.norm(x, prefix) if cfg.norm_position == "pre" else x)
        if cfg.residual == "standard":
            h = x + h
        elif cfg.residual == "normalised":
            b = cfg.residual_beta
            h = x * math.sqrt(1.0 - b * b) + h * b
        return self.norm(h, prefix) if cfg.norm_position == "post" else h

    def forward(self, idx, targets):
        cfg = self.cfg
        T = idx.shape[1]
        x = self.p("wte.weight")[idx]
        if cfg.pos == "learned":
            x = x + self.p("wpe.weight")[:T]
        elif cfg.pos == "sinusoidal":
            x = x + self.p("pe")[:T]
        for i in range(cfg.n_layer):
            x = self.sublayer(x, lambda u: self.attention(u, i), f"blocks.{i}.norm1")
            x = self.sublayer(x, lambda u: self.mlp(u, i), f"blocks.{i}.norm2")
        if self.has("ln_f.weight"):
            x = self.norm(x, "ln_f")
        logits = x @ self.p("head.weight")
        return logits, TF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    def param_groups(self, model, weight_decay):
        """AdamW groups as nanospa's AdamW makes them: no decay on ``no_decay`` parameters."""
        flags = {k.replace(".", "_"): p.no_decay for k, p in model.named_parameters()}
        decay = [p for k, p in self.params.items() if not flags[k]]
        rest = [p for k, p in self.params.items() if flags[k]]
        return [dict(params=decay, weight_decay=weight_decay), dict(params=rest, weight_decay=0.0)]
