"""nanospa/experiments/records.py: each run's record carries its checksum through result.json
(NaN, tuples, NumPy floats included), and check() refuses a changed or duplicated run by
name, keys a run written before keys from its recorded settings, and leaves a sealed one as
it is. The committed results/ pass it unchanged (every run keyed and sealed)."""
import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from nanospa.experiments import records, report, reuse  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def run(lr=1e-3, seed=0, **kw):
    return dict(dict(history=[(0, 5.5), (1, np.float32(5.25))], evals=[], final_train=np.float64(4.123456789012345),
                     final_val=4.2, diverged=False, seconds=1.5, steps_done=2, lr=lr, seed=seed, n_params=10,
                     label="espa"), **kw)


def result(*runs):
    return dict(settings=dict(steps=2, batch_size=2, warmup=0, min_lr_ratio=0.1, weight_decay=0.0, grad_clip=1.0,
                              eval_batches=1, data="default", device="cpu", lrs=[1e-3]),
                methods=dict(espa=dict(config=dict(n_layer=2, vocab_size=256), steps=2, runs=list(runs))))


def test_a_checksum_survives_result_json(tmp_path):
    sealed = records.seal(run(final_val=math.nan, diverged=True))
    report.write_json(tmp_path / "result.json", dict(runs=[sealed]))
    back = json.loads((tmp_path / "result.json").read_text())["runs"][0]
    assert back["checksum"] == sealed["checksum"] == records.checksum(back)


@pytest.mark.parametrize("change", ["final_train", "history", "seed", "key", "new field"])
def test_a_changed_run_is_refused_by_name(change):
    r = records.seal(run(key="k"))
    if change == "final_train":
        r["final_train"] = 4.12345678901234       # one digit less
    elif change == "history":
        r["history"][1] = (1, 5.0)
    elif change == "seed":
        r["seed"] = 7
    elif change == "key":
        r["key"] = "another"
    else:
        r["note"] = "looks fine"
    with pytest.raises(ValueError, match=r"^f.json: the run of espa at lr 0.001, seed \d does not match its checksum"):
        records.check(result(r), "f.json")


def test_a_duplicate_run_is_refused_not_averaged():
    a = records.seal(run(key="k"))
    with pytest.raises(ValueError, match="f.json: the run of espa at lr 0.001, seed 0 is there twice"):
        records.check(result(a, copy.deepcopy(a)), "f.json")
    with pytest.raises(ValueError, match="espa holds two runs at lr 0.001, seed 0"):
        records.check_unique([a, dict(a)], "espa")
    b = records.seal(run(seed=1, key="k1"))
    assert records.check(result(a, b), "f.json") == []             # two seeds are two runs


def test_a_run_written_before_keys_and_checksums_is_keyed_and_kept():
    old = result(run(), run(seed=1))
    notes = records.check(old, "f.json")
    assert len(notes) == 2 and "2 run(s) had no key" in notes[0] and "2 run(s) had no checksum" in notes[1]
    runs = old["methods"]["espa"]["runs"]
    job = json.loads(runs[1]["key"])
    assert job["batches"] == records.LEGACY_BATCHES and (job["lr"], job["seed"], job["steps"]) == (1e-3, 1, 2)
    assert set(job) == set(json.loads(reuse.job_key(dict(label="x", **{k: 0 for k in job}))))
    assert runs[1]["key_from"] == records.KEY_FROM and records.check(old, "f.json") == []   # now as any other


def test_a_job_today_never_has_the_legacy_sampler():
    from nanospa.experiments import runner
    assert runner.BATCHES != records.LEGACY_BATCHES and records.CURVE_POINTS == runner.CURVE_POINTS



def test_every_committed_run_has_a_key_and_matches_its_checksum():
    paths = sorted((ROOT / "results").rglob("result.json"))
    counted = 0
    for path in paths:
        held = json.loads(path.read_text())
        if "methods" not in held:                                    # fig1: kernels, no runs
            continue
        before = json.dumps(held)
        assert records.check(held, path) == [], path                  # nothing to key or seal
        assert json.dumps(held) == before
        counted += sum(len(m["runs"]) for m in held["methods"].values())
    assert counted >= 600
