"""nanospa.bench: how fast a training step is, beside PyTorch (python -m nanospa.bench).

    command.py     the command: settings, the run, the report (python -m nanospa.bench)
    measure.py     timed steps, FLOPs, the GEMM peak
    memory.py      peak memory
    report.py      the machine and the printed table
    yardstick.py   the same model in PyTorch
    ranks.py       MPI ranks against threads, side by side (python -m nanospa.bench.ranks)
"""
