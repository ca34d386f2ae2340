"""A resume is the same run or it is refused (nanospa/run/session.py, RESUME_KINDS). The test
walks every setting of train.py: each has a kind; changing a run setting on resume is refused
by name unless --allow_changed names it, a model setting is refused always (compared as
GPTConfig resolves it: 'auto' equals what it means), a free one passes. Then the real thing:
an allowed change is noted on stderr and in the log, and restarts the best validation loss
when it changes the evaluation batches."""
import json

import pytest

import train
from nanospa.beyond.optimizers import rates_for
from nanospa.run.checkpoint import CheckpointError
from nanospa.run.session import EVALUATION, RESUME_KINDS, Session, resume_kind
from nanospa.run.settings import SettingsError

TINY = ["--n_layer=2", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--eval_iters=1",
        "--sample_tokens=0", "--warmup_iters=2", "--threads=1", "--log_interval=1", "--eval_interval=2",
        "--max_iters=2"]
# A value other than the checkpoint's for every setting but the per-run ones, valid on its own.
OTHER = dict(
    max_iters=3, eval_interval=3, log_interval=2, checkpoint_interval=5, sample_tokens=5, start="A", temperature=0.5,
    top_k=5, device="cuda", threads=2, attention_impl="blockwise", attention_block=8, data="shakespeare",
    tokenizer="bpe:300", optimizer="kfac",
    batch_size=2, grad_accum=2, eval_iters=2, seed=1, learning_rate=1e-3, min_lr=1e-4, warmup_iters=3,
    lr_decay_iters=5, weight_decay=0.1, beta1=0.8, beta2=0.9, grad_clip=0.5, mup_base_width=8, kfac_damping=1e-3,
    kfac_damping_mode="exact", kfac_ema=0.9, kfac_inv_interval=5, kfac_inverse_dtype="float32", kfac_momentum=0.4,
    kfac_kl_clip=1e-2, kfac_fisher="empirical", kfac_stats_fraction=0.5, kfac_adam_lr_ratio=0.1, muon_momentum=0.9,
    muon_nesterov=False, muon_ns_steps=4, muon_adam_lr_ratio=0.2, dropout=0.1,
    # the model: GPTConfig's fields
    block_size=32, n_layer=3, n_head=4, n_embd=32, mlp_ratio=2, attention="uspa", activation="tat_gelu",
    residual="standard", residual_beta=0.2, norm="layernorm", norm_causal=True, norm_groups=2, prepbn_steps=10,
    prepbn_eta=0.5, norm_position="post", final_norm="yes", pos="learned", dtype="float64",
    kernel_budget="independent", gamma_final=0.5, rho_final=0.7, final_corr=0.3, zeta=1.6, eta=0.5, tau=0.2,
    shaping_depth=4, train_bias=True, zero_query=True, skipinit_per_head=True, bias=True, residual_attention=True,
    tie_embeddings=True,
)
CONTEXT = dict(norm_causal=["--norm=batchnorm", "--residual=standard"])   # valid only beside these
SAME_MEANING = dict(attention="espa", norm_position="pre", final_norm="no")   # what 'auto' is for this model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    text = root / "t.txt"
    text.write_text("the model learns a signal through the deep network token by token. " * 60)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANOSPA_CACHE", str(root / "cache"))
        assert train.main(TINY + [f"--data={text}", f"--out_dir={root / 'out'}"]) == 0
    return root / "out"


def resume(out, *argv):
    """The settings of a resume (no data read: Session's checks only)."""
    argv = TINY + [f"--out_dir={out}", "--init_from=resume", "--max_iters=2", *argv]
    with Session(argv, train.DEFAULTS, train.PRESETS, train.check_settings, train.MODEL_KEYS, rates_for) as run:
        return run.settings, run.changed


def test_every_setting_has_a_kind_and_every_kind_behaves(checkpoint):
    kinds = {key: resume_kind(key) for key in train.DEFAULTS}
    assert None not in kinds.values(), [k for k, v in kinds.items() if v is None]
    assert all(k in train.DEFAULTS for keys in RESUME_KINDS.values() for k in keys)   # the table names no ghost
    assert set(OTHER) == {k for k, kind in kinds.items() if kind != "per_run"}
    for key, kind in kinds.items():
        if kind == "per_run":
            continue
        flag = f"--{key}={OTHER[key]}"
        context = CONTEXT.get(key, [])
        if kind in ("free", "corpus"):             # the corpus: compared by its tokens, once read (begin)
            s, changed = resume(checkpoint, flag)
            assert s[key] == OTHER[key] and changed == {}, key
        elif kind == "run":
            with pytest.raises(SettingsError, match=rf"^resuming would change the run: {key}={OTHER[key]!r} "
                                                   rf"\(checkpoint: .*\); pass --allow_changed={key} to change it"):
                resume(checkpoint, flag)
            s, changed = resume(checkpoint, flag, f"--allow_changed={key}")
            assert list(changed) == [key] and changed[key][1] == OTHER[key] and s[key] == OTHER[key]
            s, changed = resume(checkpoint, flag, "--eval_only=True")   # evaluates, writes nothing: a note
            assert list(changed) == [key]
        else:
            with pytest.raises(CheckpointError, match=rf"the model cannot change on resume: .*{key}="):
                resume(checkpoint, flag, *context)
            with pytest.raises(SettingsError, match=rf"--allow_changed={key}: {key} is the model's"):
                resume(checkpoint, flag, f"--allow_changed={key}")


def test_auto_and_what_it_resolves_to_are_the_same_model(checkpoint):
    """The checkpoint says attention='auto' (its settings) and 'espa' (its config)."""
    for key, value in SAME_MEANING.items():
        assert resume(checkpoint, f"--{key}={value}")[1] == {}
    with pytest.raises(CheckpointError, match=r"final_norm='yes' \(= True\) \(checkpoint: False\)"):
        resume(checkpoint, "--final_norm=yes")


def test_allow_changed_takes_run_settings_on_resume_only(checkpoint, tmp_path):
    for spec, words in (("max_iters", "max_iters is free to change on resume anyway"),
                        ("data", r"data is the corpus \(another one: --new_data=True\)"),
                        ("bogus", "bogus is not a setting"), ("out_dir", "out_dir is this command's own")):
        with pytest.raises(SettingsError, match=words):
            resume(checkpoint, f"--allow_changed={spec}")
    with pytest.raises(SettingsError, match="only a resumed run"):
        Session([f"--out_dir={tmp_path / 'new'}", "--allow_changed=batch_size"], train.DEFAULTS, train.PRESETS,
                train.check_settings, train.MODEL_KEYS, rates_for).__enter__()
    s, changed = resume(checkpoint, "--batch_size=2", "--eval_iters=3", "--allow_changed=eval_iters,batch_size")
    assert changed == dict(batch_size=(4, 2), eval_iters=(1, 3))


def test_an_allowed_change_is_in_the_log_and_restarts_the_best_validation_loss(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "t.txt"
    text.write_text("the model learns a signal through the deep network token by token. " * 60)
    out = tmp_path / "out"
    common = TINY + [f"--data={text}", f"--out_dir={out}"]
    assert train.main(common) == 0
    assert train.main(common + ["--init_from=resume", "--max_iters=4", "--batch_size=2"]) == 2
    assert "batch_size=2 (checkpoint: 4)" in capsys.readouterr().err
    assert train.main(common + ["--init_from=resume", "--max_iters=4", "--batch_size=2",
                                "--allow_changed=batch_size"]) == 0
    captured = capsys.readouterr()
    assert "note: --allow_changed: from iter 2 on, batch_size=2 (was 4); the evaluation batches changed" in captured.err
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in log] == [0, 1, 2, 2, 3, 4] and log[3] == dict(iter=2, changed_on_resume=dict(batch_size=[4, 2]))
    best = min(r["val_loss"] for r in log[4:] if "val_loss" in r)         # only the new evaluation set's
    assert f"(best {best:.4f})" in captured.out
    assert set(EVALUATION) <= set(RESUME_KINDS["run"])


@pytest.mark.parametrize("key, value", [("batch_size", "16"), ("learning_rate", float("inf")), ("overwrite", 1),
                                        ("eval_only", "yes"), ("beta1", None)])
def test_a_hand_edited_checkpoint_setting_is_refused_by_name(key, value, checkpoint, tmp_path):
    """A setting of the wrong type typed the command line's value too ('--batch_size=32' became
    the string '32') and then raised TypeError in the checks."""
    import shutil

    import numpy as np
    out = tmp_path / "out"
    shutil.copytree(checkpoint, out)
    with np.load(out / "ckpt.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    settings = json.loads(str(arrays["settings"]))
    settings[key] = value
    arrays["settings"] = np.array(json.dumps(settings))
    np.savez(out / "ckpt.npz", **arrays)
    if key in RESUME_KINDS["per_run"]:                 # never read from a checkpoint: nothing to refuse
        assert resume(out, "--batch_size=4")[0][key] == train.DEFAULTS[key]
        return
    with pytest.raises(CheckpointError, match=rf"its settings hold {key}={value!r}, not values train.py writes"):
        resume(out, "--batch_size=32")
