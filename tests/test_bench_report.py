"""nanospa/bench/report.py: what the machine record holds and the printed table of a report
(built here by hand, so no benchmark runs)."""
from nanospa.bench.report import OPENBLAS_VARS, THREAD_VARS, format_report, machine_info


def test_machine_info_names_the_command_cpu_and_libraries():
    info = machine_info("2026-01-01T00:00:00", (0.5, 0.5, 0.5), "cpu", None,
                        dict(mode="shards", nanospa_threads=2, blas_threads=1, blas_threads_set_by="OPENBLAS_NUM_THREADS"))
    assert {"date", "command", "platform", "cpu", "cpu_count", "python", "numpy", "env"} <= set(info)
    assert info["torch"] is None and info["command"].startswith("python -m nanospa.bench")
    assert set(info["env"]) == set(THREAD_VARS + OPENBLAS_VARS) and info["threads"]["nanospa_threads"] == 2
    assert "gpu" not in info


def report(torch=True):
    machine = dict(date="2026-01-01T00:00:00", command="python -m nanospa.bench --config=tiny", cpu="A CPU",
                   cpu_count=2, numpy="2.0", torch="2.1" if torch else None, load_average=(1.0, 1.0, 1.0),
                   load_average_start=(0.5, 0.5, 0.5), env={"OPENBLAS_CORETYPE": None},
                   threads=dict(mode="shards", nanospa_threads=2, blas_threads=1,
                                blas_threads_set_by="OPENBLAS_NUM_THREADS",
                                libraries=[dict(internal_api="openblas", version="0.3", architecture="Haswell")]))
    frameworks = dict(nanospa=dict(tokens_per_s=1000.0, step_s_median=0.032, mfu=0.5, peak_mem_bytes=3 * 2 ** 20))
    if torch:
        frameworks["pytorch"] = dict(tokens_per_s=900.0, step_s_median=0.0355, mfu=0.45, peak_mem_bytes=None)
    r = dict(config="tiny", gpt_config=dict(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=256,
                                            attention="espa", activation="tat_lrelu"),
             batch_size=2, dtype="float32", device="cpu", threads=2, cpu_threading="shards", steps=10,
             model_flops=dict(per_step=2.5e9, formula="F"), gemm_peak_flops=5e10, gemm_n=2048,
             frameworks=frameworks)
    if torch:
        r["ratio_nanospa_over_pytorch"] = dict(median=1.11, q25=1.05, q75=1.2)
    return dict(machine=machine, results=[r])


def test_the_table_has_a_line_per_framework_and_the_paired_ratio():
    lines = format_report(report()).splitlines()
    assert lines[0] == "nanospa bench  2026-01-01T00:00:00  A CPU (2 cores)"
    assert lines[2] == "numpy 2.0, torch 2.1, load average 0.5 at start, 1.0 at end"
    assert lines[3] == ("threads: nanospa 2 x BLAS 1 (shards; BLAS threads by OPENBLAS_NUM_THREADS); "
                        "numpy's OpenBLAS 0.3 kernel Haswell; OPENBLAS_CORETYPE=None")
    assert lines[5] == "[tiny] L=2 C=32 H=2 T=16 B=2 V=256 espa/tat_lrelu float32 cpu threads=2 (shards)"
    assert lines[6] == "  model FLOPs/step 2.50 G (F); GEMM peak 50.0 GFLOP/s (n=2048)"
    assert lines[8] == "  nanospa          1000      32.0  50.0%      3 MiB"
    assert lines[9] == "  pytorch           900      35.5  45.0%          -"
    assert lines[10] == "  speed nanospa/pytorch: 1.11 (median of 10 paired steps, quartiles 1.05-1.20)"


def test_without_torch_there_is_no_ratio_line():
    text = format_report(report(torch=False))
    assert "torch not installed" in text and "pytorch" not in text and "speed" not in text


def test_the_fresh_process_line_gives_its_ratio_and_flags_disagreement():
    rep = report()
    r = rep["results"][0]
    r["yardstick"] = dict(rows=["pytorch"], unavailable={}, compile_s={},
                          fresh_process=dict(torch_threads=2, rows=dict(pytorch=dict(step_s_median=0.0288,
                                                                                     over_in_process=-0.19))))
    text = format_report(rep)
    assert ("alone in a fresh process (torch + yardstick.py, torch threads 2): pytorch 28.8 ms/step "
            "(-19.0% vs in-process; nanospa's speed over it 0.90)") in text     # 0.0288 / 0.032
    assert "differ by more than 5%" in text
    r["yardstick"]["fresh_process"]["rows"]["pytorch"]["over_in_process"] = 0.04
    assert "differ by more than" not in format_report(rep)
