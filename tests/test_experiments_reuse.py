"""--reuse (nanospa/experiments/reuse.py): a run of an identical job is taken from an earlier
result.json instead of being trained again, with its origin recorded; a job that differs in
any field is trained; a bad path is one error line before any work."""
import pytest
import json

from nanospa.experiments import fig2, longer, reuse

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it


def _runs(result, label):
    return sorted(result["methods"][label]["runs"], key=lambda r: (r["lr"], r["seed"]))


def test_longer_takes_fig2s_identical_runs_and_ends_as_if_it_trained_them(tmp_path, capsys):
    a, b, c = tmp_path / "fig2", tmp_path / "fresh", tmp_path / "reused"
    common = ["--preset=tiny", "--lrs=1e-3,3e-3", "--seeds=2"]
    assert fig2.main(common + ["--methods=espa,pre_ln", f"--out={a}"]) == 0
    assert longer.main(common + ["--methods=pre_ln,espa,espa_long", f"--out={b}"]) == 0
    capsys.readouterr()
    assert longer.main(common + ["--methods=pre_ln,espa,espa_long", f"--out={c}", f"--reuse={a}"]) == 0
    out = capsys.readouterr().out
    assert "8 of them reused" in out and out.count("(reused from ") == 8
    fresh, got = (json.loads((p / "result.json").read_text()) for p in (b, c))
    source = json.loads((a / "result.json").read_text())
    for label in ("pre_ln", "espa"):
        for r, f, s in zip(_runs(got, label), _runs(fresh, label), _runs(source, label)):
            assert r["reused"] == {"from": str(a / "result.json"), "commit": source["provenance"]["commit"]}
            assert r["history"] == s["history"] == f["history"] and r["key"] == f["key"]
    assert not any(r.get("reused") for r in got["methods"]["espa_long"]["runs"])    # not in fig2
    for label in ("pre_ln", "espa", "espa_long"):
        assert got["methods"][label]["summary"]["final_train"] == fresh["methods"][label]["summary"]["final_train"]
    assert got["analysis"] == fresh["analysis"]
    assert "- Reused: 8 runs from " in (c / "table.md").read_text()
    assert "; identical jobs), not retrained" in (c / "table.md").read_text()


def test_a_job_that_differs_in_any_field_is_trained():
    job = dict(label="pre_ln", config=dict(n_layer=4), steps=3, lr=1e-3, seed=0, optimizer={}, batch_size=2,
               warmup=None, min_lr_ratio=0.1, weight_decay=0.0, grad_clip=1.0, eval_batches=1, log_every=1,
               data="default", device="cpu", tokenizer="byte", batches="data.get_batch")
    run = dict(key=reuse.job_key(job), history=[[0, 5.0]], label="pre_ln")
    reusable = dict(keyed={run["key"]: (run, {"from": "x/result.json", "commit": "abc"})})
    taken, todo = reuse.take([dict(job, label="other")], reusable)          # the label is not identity
    assert [r["label"] for _, r in taken] == ["other"] and todo == []
    for field, value in [("lr", 3e-3), ("seed", 1), ("steps", 4), ("config", dict(n_layer=5)),
                         ("tokenizer", "bpe:300"), ("data", "shakespeare"), ("warmup", 0), ("device", "cuda"),
                         ("batches", "another sampler")]:
        taken, todo = reuse.take([dict(job, **{field: value})], reusable)
        assert taken == [] and len(todo) == 1, field


def test_a_bad_reuse_path_is_one_error_line_and_status_2(tmp_path, capsys):
    out = tmp_path / "o"
    assert fig2.main(["--preset=tiny", "--methods=espa", f"--out={out}", f"--reuse={tmp_path / 'nothing'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: reuse: cannot read runs from") and err.count("\n") == 1
    assert not (out / "result.json").exists()


def test_runs_of_the_former_batch_sampler_are_never_taken(tmp_path, capsys):
    """Results written before the experiments drew train.py's batches (no key, or a key that
    names no sampler) ran other windows than any job today: every run is trained again."""
    a, b = tmp_path / "old", tmp_path / "new"
    common = ["--preset=tiny", "--lrs=1e-3", "--seeds=3"]
    assert fig2.main(common + ["--methods=espa", f"--out={a}"]) == 0
    old = json.loads((a / "result.json").read_text())
    jobs = _jobs(old)
    assert reuse.take(jobs, reuse.load([a]))[1] == []                 # today's keys: all taken
    runs = old["methods"]["espa"]["runs"]
    job = json.loads(runs[0]["key"])
    del job["batches"]
    runs[0]["key"] = json.dumps(job)                                  # as keyed before the shared sampler
    del runs[1]["key"]                                                # as written before keys
    for r in runs[:2]:
        del r["checksum"]                                             # (and before checksums)
    (a / "result.json").write_text(json.dumps(old))
    taken, todo = reuse.take(jobs, reuse.load([a]))
    assert len(taken) == len(jobs) - 2 and len(todo) == 2
    capsys.readouterr()
    assert fig2.main(common + ["--methods=espa", f"--out={b}", f"--reuse={a}"]) == 0
    assert f"{len(jobs) - 2} of them reused" in capsys.readouterr().out


def _jobs(result):
    """The jobs of a result's keyed runs, back from their keys."""
    return [dict(json.loads(r["key"]), label=label) for label, m in result["methods"].items() for r in m["runs"]]


def test_a_key_written_before_a_new_config_field_still_matches(tmp_path):
    """fig2's study was keyed before GPTConfig.prepbn_eta existed: a field added at its
    default changes no run, so the stored key is read with today's defaults."""
    a = tmp_path / "old"
    assert fig2.main(["--preset=tiny", "--methods=espa", f"--out={a}"]) == 0
    old = json.loads((a / "result.json").read_text())
    jobs = _jobs(old)
    for r in old["methods"]["espa"]["runs"]:
        job = json.loads(r["key"])
        job["config"].pop("prepbn_eta")
        r["key"] = json.dumps(job)
        del r["checksum"]                                             # written before checksums, too
    (a / "result.json").write_text(json.dumps(old))
    taken, todo = reuse.take(jobs, reuse.load([a]))
    assert len(taken) == len(jobs) and todo == []
    changed = [dict(job, config=dict(job["config"], prepbn_eta=0.5)) for job in jobs]   # not the default
    assert reuse.take(changed, reuse.load([a]))[0] == []


def test_a_reuse_file_missing_a_field_is_one_line_naming_it(tmp_path, capsys):
    a = tmp_path / "old"
    assert fig2.main(["--preset=tiny", "--methods=espa", f"--out={a}"]) == 0
    held = json.loads((a / "result.json").read_text())
    del held["methods"]["espa"]["runs"][0]["final_train"]
    (a / "result.json").write_text(json.dumps(held))
    capsys.readouterr()
    assert fig2.main(["--preset=tiny", "--methods=espa", f"--out={tmp_path / 'new'}", f"--reuse={a}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(a / "result.json") in err and "'final_train'" in err
    del held["methods"]
    (a / "result.json").write_text(json.dumps(held))
    assert fig2.main(["--preset=tiny", "--methods=espa", f"--out={tmp_path / 'new'}", f"--reuse={a}"]) == 2
    assert "no field 'methods'" in capsys.readouterr().err
