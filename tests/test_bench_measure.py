"""nanospa/bench/measure.py: the FLOP formula by hand, the benchmarked configurations and
their overrides, the token batch, the GEMM probe's count, the alternating timed rounds
(with stand-in steps: no time is asserted), and one real nanospa step."""
import numpy as np
import pytest

from nanospa.run import threads as cpu
from nanospa import GPT, GPTConfig, backend
from nanospa.bench.measure import (ARCH, CONFIGS, GemmProbe, NanospaStep, make_batch, make_config, model_flops,
                                   time_steps)


def test_model_flops_by_hand():
    cfg = GPTConfig(vocab_size=10, block_size=4, n_layer=2, n_head=1, n_embd=3, mlp_ratio=4)
    f = model_flops(cfg, batch_size=5)
    N = 2 * (4 * 9 + 2 * 4 * 9) + 3 * 10          # q, k, v, proj; fc, proj; head = 246
    assert f["n_matmul_params"] == N
    assert f["per_token"] == 6 * N + 12 * 2 * 4 * 3
    assert f["per_step"] == f["per_token"] * 5 * 4


def test_configurations_are_vanilla_espa_with_overrides_on_top():
    cfg, batch = make_config("ref", {}, "float32")
    assert (cfg.n_layer, cfg.n_embd, cfg.block_size, batch) == (12, 256, 256, 8)
    assert {k: getattr(cfg, k) for k in ARCH} == ARCH
    cfg, batch = make_config("tiny", dict(n_layer=3, batch_size=5, attention="softmax"), "float64")
    assert (cfg.n_layer, cfg.attention, cfg.dtype, batch) == (3, "softmax", "float64", 5)
    assert make_config("tiny", {}, "float32")[1] == CONFIGS["tiny"][1]


def test_batch_targets_are_the_next_tokens():
    cfg, batch = make_config("tiny", {}, "float32")
    idx, targets = make_batch(cfg, batch)
    assert idx.shape == targets.shape == (batch, cfg.block_size) and idx.max() < cfg.vocab_size
    np.testing.assert_array_equal(targets[:, :-1], idx[:, 1:])
    np.testing.assert_array_equal(make_batch(cfg, batch)[0], idx)            # fixed seed


def test_gemm_probe_counts_one_product_per_worker_thread():
    threads = cpu.threads()
    try:
        cpu.set_threads(2)
        probe = GemmProbe(16, "float32")
        assert probe.flops == 2.0 * 16 ** 3 * 2 and probe.nbytes == 4 * 16 * 16 * 4
        assert probe() > 0
    finally:
        cpu.set_threads(threads)


class Stub:
    def __init__(self, name, log, seconds):
        self.name, self.log, self.seconds = name, log, seconds

    def __call__(self):
        self.log.append(self.name)
        return self.seconds


def test_rounds_alternate_who_goes_first_after_untimed_warmup():
    log = []
    runners = [Stub("a", log, 1.0), Stub("b", log, 2.0)]
    gemm = Stub("gemm", log, 5.0)
    times, peaks = time_steps(runners, gemm, steps=3, warmup=1, settle=0, gemm_reps=2)
    assert log == ["a", "b", "gemm",                                  # warm-up, untimed
                   "a", "b", "gemm", "gemm", "b", "a", "gemm", "gemm", "a", "b", "gemm", "gemm"]
    assert times == dict(a=[1.0] * 3, b=[2.0] * 3) and peaks == [5.0] * 3


def test_a_nanospa_step_trains():
    cfg, batch = make_config("tiny", dict(dtype="float64"), "float64")
    model = GPT(cfg, seed=0)
    idx, targets = make_batch(cfg, batch)
    before = model(idx, targets)[1].item()
    step = NanospaStep(model, idx, targets)
    assert all(step() > 0 for _ in range(3))
    assert model(idx, targets)[1].item() < before
    assert all(p.grad is None for p in model.parameters())           # zero_grad after the step


def test_profile_puts_every_op_of_a_step_in_a_kind_and_leaves_the_engine_as_it_was():
    from nanospa.bench.measure import NanospaStep, make_batch, make_config
    from nanospa.bench.profile import BATCHED, LINEAR, OPTIMIZER, REST, profile_nanospa
    from nanospa.model import GPT
    from nanospa.shape_ops import MatMul
    before = MatMul.__dict__["forward"], MatMul.__dict__["backward"]
    cfg, batch = make_config("tiny", {}, "float32")
    step = NanospaStep(GPT(cfg, seed=0), *make_batch(cfg, batch))
    kinds, wall, n = profile_nanospa(step, steps=2)
    assert (MatMul.__dict__["forward"], MatMul.__dict__["backward"]) == before   # the wrappers are gone
    assert "timed_opt_step" not in repr(step.opt.step)
    assert kinds[LINEAR] > 0 and kinds[BATCHED] > 0 and kinds[OPTIMIZER] > 0 and "softmax" in kinds
    assert "other ops" not in kinds                               # every op of the model has its kind
    assert n == 1 and min(kinds.values()) >= 0 and kinds[REST] > 0   # one thread: the ops fit in the wall time
    assert sum(kinds.values()) == pytest.approx(wall, rel=1e-9)
