"""nanospa.run: what running commands needs and the paper does not. train.py, data.py, the
benchmark and the experiments call these; the core (nanospa/*.py, nanospa/signal) never does.

    settings.py     the one --key=value parser and the failure convention of every command
    checks.py       train.py's check of its settings, before any data is read
    rundir.py       an out_dir: its lock, its append-only log, signals
    checkpoint.py   checkpoint files: written atomically, only from a finite state
    corpus.py       where the text of a dataset comes from, and its caches
    tokenizer.py    the byte-level BPE (the bpe extra)
    threads.py      explicit CPU parallelism: worker threads on slices of a batch
    heads.py        dense attention's heads on those threads when a batch has fewer sequences
    malloc.py       freed memory kept in the process: no page faults from each step's arrays
    distributed.py  data parallelism over MPI processes and NCCL GPUs (the mpi extra)
"""
