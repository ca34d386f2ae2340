"""Dropout (GPTConfig.dropout; nn.Dropout, beyond/dropout.py DropoutMasks and Dropout): nanoGPT's
three places, active in training mode only, inverted (kept entries times 1 / (1 - p)), masks
that change with each optimiser step and not with how a step is split (worker threads'
slices, micro-batches, MPI ranks), a prefix of a sequence seeing the masks of the whole, and
what dropout does to the kernel at init (docs/method.md §2.5) measured on a model in training
mode against the maps stated there. The op's float64 gradient check with a fixed mask is in
tests/test_functions.py (OPS["dropout"]); the device in tests/test_gpu.py; resume-exact runs
in tests/test_train.py."""
import types

import numpy as np
import pytest

from conftest import tiny_config
from nanospa import GPT, GPTConfig, Tensor, signal
from nanospa.gradcheck import check_directions
from nanospa.beyond.dropout import DropoutMasks, DropoutSite
from nanospa.predict import predict_kernels
from nanospa.sampling import generate
from nanospa.run import step, threads
from nanospa.run.threads import batch_rows

IDX = np.random.default_rng(0).integers(0, 13, (4, 8))
TARGETS = np.roll(IDX, -1, axis=1)


def dropped(p=0.25, **kw):
    """A float64 tiny model with dropout p, moved off its init (W^Q = 0 there)."""
    model = GPT(tiny_config(dropout=p, **kw), seed=0)
    rng = np.random.default_rng(3)
    for q in model.parameters():
        q.data = q.data + 0.3 * rng.standard_normal(q.shape)
    return model


def test_config_takes_a_rate_in_0_1_and_refuses_what_cannot_drop():
    assert GPTConfig().dropout == 0.0
    for bad in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="GPTConfig.dropout"):
            GPTConfig(dropout=bad)
    with pytest.raises(ValueError, match=r"dropout=0.1 needs dense attention.*attention_impl='dense'"):
        GPTConfig(dropout=0.1, attention_impl="blockwise")
    with pytest.raises(ValueError, match=r"dropout=0.1 needs dense attention"):
        GPTConfig(dropout=0.1, block_size=512)                       # 'auto' works by blocks there
    GPTConfig(dropout=0.1, block_size=512, attention_impl="dense")
    with pytest.raises(ValueError, match=r"GPTConfig.dropout=0.1 with residual='ngpt'"):
        GPTConfig(dropout=0.1, residual="ngpt", activation="swish")
    assert GPTConfig().paper_only() and not GPTConfig(dropout=0.1).paper_only()   # its masks: beyond/dropout.py


def test_kept_entries_are_scaled_by_one_over_one_minus_p():
    """Inverted dropout: each entry kept with probability 1 - p (within 5 standard errors over
    2^16 entries), kept ones times exactly 1 / (1 - p), the others 0; so the mean stays."""
    for p in (0.1, 0.5):
        d = DropoutSite(p, (16, 64))
        d.masks, d.site = DropoutMasks(0), 0
        x = np.ones((64, 16, 64))
        y = d(Tensor(x)).data
        kept = y != 0
        assert abs(kept.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / x.size)
        assert np.all(y[kept] == 1.0 / (1.0 - p))
        assert abs(y.mean() - 1.0) < 5 * np.sqrt(p / (1 - p) / x.size)


def test_masks_look_independent_across_entries_positions_rows_steps_and_sites():
    """p = 1/2 over 2^20 entries: neighbours along each axis of the counter (entry, position,
    row), the next step's and the next site's masks are both kept a quarter of the time, within
    5 standard errors (measured: |z| <= 1.3)."""
    masks, x = DropoutMasks(0), np.zeros((256, 64, 64))
    k = masks.keep(x, 0, 0.5, (64, 64)).astype(float)
    other_site = masks.keep(x, 1, 0.5, (64, 64)).astype(float)
    masks.step = 1
    next_step = masks.keep(x, 0, 0.5, (64, 64)).astype(float)
    pairs = dict(entry=(k[..., :-1], k[..., 1:]), position=(k[:, :-1], k[:, 1:]), row=(k[:-1], k[1:]),
                 step=(k, next_step), site=(k, other_site), alone=(k, np.ones_like(k) * 0.5))
    for name, (u, v) in pairs.items():
        z = ((u * v).mean() - 0.25) / np.sqrt(0.25 * 0.75 / u.size)
        assert abs(z) < 5, (name, z)


def test_training_mode_drops_and_evaluation_mode_is_the_model_without_dropout():
    """model.eval() (and generate, which evaluates) is the same model as dropout=0, bit for
    bit (dropout draws nothing at init: the weights are the same too); model.train() drops."""
    cfg = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)
    model, plain = GPT(GPTConfig(dropout=0.3, **cfg), seed=0), GPT(GPTConfig(**cfg), seed=0)
    for (n, a), (_, b) in zip(model.named_parameters(), plain.named_parameters()):
        np.testing.assert_array_equal(a.data, b.data, err_msg=n)
    assert not np.array_equal(model(IDX)[0].data, plain(IDX)[0].data)          # training mode: dropped
    with model.evaluating():
        np.testing.assert_array_equal(model(IDX)[0].data, plain(IDX)[0].data)
    np.testing.assert_array_equal(generate(model, IDX[:1, :3], 6, temperature=0),
                                  generate(plain, IDX[:1, :3], 6, temperature=0))
    assert model.training                                                     # generate restored the mode


def test_masks_change_with_each_step_and_only_with_it():
    """Every forward of one step sees the step's masks (its slices, a K-FAC curvature pass, a
    repeated call); after_step (once per optimiser step) moves them on, and back to a step's
    state gives its masks again; another seed, other masks."""
    model = dropped()
    first = model(IDX)[0].data
    np.testing.assert_array_equal(model(IDX)[0].data, first)
    model.after_step()
    second = model(IDX)[0].data
    assert not np.allclose(second, first)
    model.dropout_masks.load(dict(model.dropout_masks.state(), step=0))
    np.testing.assert_array_equal(model(IDX)[0].data, first)
    other = dropped()
    other.dropout_masks = DropoutMasks(1)
    for site, d in enumerate(m for m in other.modules() if isinstance(m, DropoutSite)):
        d.masks, d.site = other.dropout_masks, site
    assert not np.allclose(other(IDX)[0].data, first)


def test_a_model_without_dropout_has_no_sites():
    """dropout = 0 (the default): every site is model.identity, no DropoutSite is built and the
    model has no masks; the same shape with dropout has 1 + 3 L sites."""
    from nanospa.model import identity
    plain = GPT(tiny_config(n_layer=2))
    assert not any(isinstance(m, DropoutSite) for m in plain.modules()) and plain.dropout_masks is None
    assert plain.drop is identity
    assert all(b.attn.attn_drop is identity and b.attn.resid_drop is identity and b.mlp.drop is identity
               for b in plain.blocks)
    dropped_ = GPT(tiny_config(n_layer=2, dropout=0.1))
    assert sum(isinstance(m, DropoutSite) for m in dropped_.modules()) == 1 + 3 * 2


def test_every_site_has_its_own_masks():
    """nanoGPT's places, each a numbered site: the embedding, each attention's P and output,
    each MLP's output; two sites never share masks."""
    model = dropped()
    sites = [(name, m.site) for name, m in _named_modules(model) if isinstance(m, DropoutSite)]
    assert sorted(s for _, s in sites) == list(range(1 + 3 * model.config.n_layer))
    assert {name.rsplit(".", 1)[-1] for name, _ in sites} == {"drop", "attn_drop", "resid_drop"}
    x = np.zeros((2, 8, 8))
    masks = [model.dropout_masks.keep(x, s, 0.5, (8, 8)) for s in range(3)]
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def _named_modules(m, prefix=""):
    yield prefix, m
    for name, child in m.children():
        yield from _named_modules(child, f"{prefix}.{name}" if prefix else name)


def test_a_row_draws_its_own_masks_however_the_batch_is_split():
    """Rows 2..3 called alone as rows 2.. of the step's batch (batch_rows) get the whole
    batch's masks: what the worker threads' slices, the micro-batches and MPI's ranks do; and
    a prefix of the sequences sees the whole sequences' masks (causal in training mode too)."""
    model = dropped()
    whole = model(IDX)[0].data
    with batch_rows(2):
        np.testing.assert_allclose(model(IDX[2:])[0].data, whole[2:], rtol=1e-12, atol=1e-12)
    assert not np.allclose(model(IDX[2:])[0].data, whole[2:])     # rows 0.. of the batch: other masks
    np.testing.assert_allclose(model(IDX[:, :5])[0].data, whole[:, :5], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_threads, accum", [(2, 1), (1, 2), (2, 2)])
def test_a_step_split_into_threads_and_micro_batches_is_the_whole_batchs(n_threads, accum):
    """train.py's step (run/step.py's micro_batches and forward, threads.SlicedLoss) with
    dropout: the gradients of the whole batch in one call, to float64 rounding, whatever the
    threads and micro-batches (the masks are the rows', not the slices')."""
    model = dropped()
    _, loss = model(IDX, TARGETS)
    loss.backward()
    whole = [q.grad.copy() for q in model.parameters()]
    model.zero_grad()
    previous = threads.set_threads(n_threads)
    try:
        for xs, ys, weight in step.micro_batches(IDX, TARGETS, accum):
            (step.forward(model, xs, ys) * weight).backward()
    finally:
        threads.set_threads(previous)
    for g, q in zip(whole, model.parameters()):
        np.testing.assert_allclose(q.grad, g, rtol=1e-10, atol=1e-12)


def test_an_mpi_ranks_rows_draw_the_batchs_masks():
    """Under MPI each rank holds rows [rank n, (rank + 1) n) of each micro-batch
    (World.shard): inside micro_batches' loop a call on them draws those rows' masks."""
    model = dropped()
    whole = model(IDX)[0].data
    for rank in (0, 1):
        world = types.SimpleNamespace(rank=rank, size=2, shard=lambda x, r=rank: x[r * len(x) // 2:(r + 1) * len(x) // 2])
        for j, (xs, _, _) in enumerate(step.micro_batches(IDX, TARGETS, 2, world)):
            rows = slice(2 * j + rank, 2 * j + rank + 1)             # micro-batch j: rows 2j, 2j + 1
            np.testing.assert_allclose(model(xs)[0].data, whole[rows], rtol=1e-12, atol=1e-12)


def test_a_dropout_model_passes_its_gradient_check_in_training_mode():
    """Within a step the masks are fixed, so central differences see one function: the
    directional check of the whole model with every dropout site active, for each attention kind."""
    for attention in ("espa", "softmax", "value_skipinit"):
        model = dropped(attention=attention)
        assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=2) < 1e-6


def test_predictions_are_of_the_model_in_evaluation_mode():
    """predict.py leaves dropout out (docs/method.md §2.5): the same kernels with and without it."""
    cfg = dict(vocab_size=13, block_size=8, n_layer=3, n_head=2, n_embd=8)
    a, b = predict_kernels(GPTConfig(dropout=0.4, **cfg)), predict_kernels(GPTConfig(**cfg))
    for layer in range(4):
        for sublayer in ("attn_branch", "mlp"):
            np.testing.assert_array_equal(a.kernel(layer, sublayer), b.kernel(layer, sublayer))


def dropout_kernel(Sigma, p):
    """method §2.5: the mean kernel after one dropout site, Sigma + p / (1 - p) diag(Sigma)."""
    return Sigma + p / (1 - p) * np.diag(np.diag(Sigma))


def dropped_attention_kernel(A, Sigma, p):
    """method §2.5: the mean kernel of (m o A / (1 - p)) V, A Sigma A^T + p / (1 - p) diag((A o A) diag Sigma)."""
    return A @ Sigma @ A.T + p / (1 - p) * np.diag((A * A) @ np.diag(Sigma))


def test_the_kernel_at_init_in_training_mode_follows_the_dropout_maps():
    """A vanilla E-SPA model at init in training mode, its kernels averaged over 16 rows' masks
    in each of 100 steps: the embedding's is Sigma_0 + p / (1 - p) diag(Sigma_0) (the diagonal
    up by 1 / (1 - p), off-diagonals kept), block 1's attention sublayer's (D_l P, with W^V
    and W^O orthogonal, then the output's dropout) the map of method §2.5. Both are exact in
    expectation at any width; what remains is the Monte Carlo error of the draws, largest on
    the attention's diagonal, where one mask entry silences a whole head's row (measured over
    seeds 0-2: 0.004-0.007 of q for the embedding, 0.006-0.013 for the attention; bound 0.04).
    The evaluation mode's map, A Sigma_0 A^T, misses by 0.6 of q."""
    p, T = 0.3, 8
    model = GPT(GPTConfig(vocab_size=13, block_size=T, n_layer=1, n_head=8, n_embd=64, dropout=p,
                          dtype="float64"), seed=0)
    idx = np.tile(np.arange(T), (16, 1))
    with model.evaluating():
        clean = model.trace(idx[:1])
    Sigma_0 = signal.kernel_matrix(clean.hidden[0][0])
    A = clean.attention[0][0, 0]                                      # D_l softmax(B_l): W^Q = 0
    embedding, attention, steps = np.zeros((T, T)), np.zeros((T, T)), 100
    for _ in range(steps):
        tr = model.trace(idx)                                          # training mode: dropped
        embedding += signal.kernel_matrix(tr.hidden[0], mean=True) / steps
        attention += signal.kernel_matrix(tr.attn_out[0], mean=True) / steps
        model.after_step()
    predicted_0 = dropout_kernel(Sigma_0, p)
    predicted_1 = dropout_kernel(dropped_attention_kernel(A, predicted_0, p), p)
    q = np.diag(predicted_1).max()
    assert np.abs(embedding - predicted_0).max() < 0.04 * np.diag(predicted_0).max()
    assert np.abs(attention - predicted_1).max() < 0.04 * q
    assert np.abs(attention - A @ Sigma_0 @ A.T).max() > 0.3 * q       # what evaluation mode's map says
