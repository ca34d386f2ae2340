"""The training loop of train.py in miniature, for tests/test_distributed.py to launch under
`mpiexec -n N` (or alone): a tiny float64 GPT trained with the engine directly (GPT, AdamW,
gradient clipping, sharded_backward) through nanospa.run.distributed.World, exactly as train.py
is to use it:

    world.check_batch(B)                       before any collective
    x, y = get_batch(...)                      the same global batch on every rank
    loss = sharded_backward(f, shard(x), shard(y))
    world.allreduce_grads(params)              before clipping: the norm is the global one
    clip_grad_norm; world.mean(loss); AdamW step
    evaluation: world.mean of the shard's loss
    rank 0 alone writes the checkpoint (np.savez, atomically) and the result file

Options (all --key=value): steps, batch, seed, save_at (write --ckpt after that many steps),
resume (start from --ckpt), fail_rank, fail_step, fail (raise | kill | exit2), wait_sigint
(sleep between steps, save and exit 130 on Ctrl-C), out (JSON results, rank 0), threads,
device (cpu | cuda), dtype, force_comm (World(MPI.COMM_WORLD) even for one process), plant
(sum_not_mean | no_allreduce: errors the tests must catch).
"""
import json
import os
import signal
import sys
import time

import numpy as np

from data import get_batch
from nanospa import GPT, GPTConfig, backend
from nanospa.run.distributed import World
from nanospa.run.distributed import world as get_world
from nanospa.optim import AdamW, clip_grad_norm
from nanospa.run.settings import fail
from nanospa.run.threads import set_threads, sharded_backward
from nanospa.tensor import no_grad

CONFIG = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
DEFAULTS = dict(steps=6, batch=4, seed=0, save_at=0, resume=False, ckpt="", out="", fail_rank=-1, fail_step=-1,
                fail="", wait_sigint=False, grad_clip=0.05, lr=3e-2, threads=1, plant="", device="cpu",
                force_comm=False, dtype="float64")
TOKENS = np.random.default_rng(7).integers(0, CONFIG["vocab_size"], 4000)  # the "corpus"


def parse(argv):
    s = dict(DEFAULTS)
    for a in argv:
        key, value = a[2:].split("=", 1)
        s[key] = type(DEFAULTS[key])(json.loads(value) if isinstance(DEFAULTS[key], bool) else value)
    return s


def save(path, model, opt, rng, step):
    """np.savez of the model, AdamW and the global batch generator: nothing rank-specific."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in opt.state_dict().items()})
    arrays["state"] = np.array(json.dumps(dict(step=step, rng=rng.bit_generator.state)))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path, model, opt, rng):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    state = json.loads(str(arrays.pop("state")))
    model.load_state_dict({k[6:]: v for k, v in arrays.items() if k.startswith("model/")})
    opt.load_state_dict({k[6:]: v for k, v in arrays.items() if k.startswith("optim/")})
    rng.bit_generator.state = state["rng"]
    return state["step"]


def main(argv):
    s = parse(argv)
    world = get_world()
    if s["force_comm"]:                               # the real collectives even with one process
        from mpi4py import MPI
        world = World(MPI.COMM_WORLD)
    world.check_batch(s["batch"])                     # every rank, before any collective
    world.use_device(s["device"])                     # cuda: this rank's GPU and NCCL
    backend.use(s["device"])
    set_threads(s["threads"])
    model = GPT(GPTConfig(**{**CONFIG, "dtype": s["dtype"]}), seed=s["seed"])
    params = model.parameters()
    opt = AdamW(params, lr=s["lr"], betas=(0.9, 0.95))
    rng = np.random.default_rng(s["seed"])
    start = load(s["ckpt"], model, opt, rng) if s["resume"] else 0
    model.load_state_dict(world.bcast(model.state_dict()))   # rank 0's weights everywhere
    eval_x, eval_y = get_batch(TOKENS, s["batch"], CONFIG["block_size"], np.random.default_rng(99))
    stop = []
    if s["wait_sigint"]:
        signal.signal(signal.SIGINT, lambda signum, frame: stop.append(signum))
    losses, evals, norms, saves = [], [], [], 0
    B, T = s["batch"], CONFIG["block_size"]
    for step in range(start, s["steps"]):
        if step == s["fail_step"] and world.rank == s["fail_rank"]:
            if s["fail"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if s["fail"] == "exit2":
                return 2
            raise RuntimeError(f"planted failure on rank {world.rank} at step {step}")
        x, y = get_batch(TOKENS, B, T, rng)           # (B, T): the same global batch on every rank
        loss = sharded_backward(lambda a, b: model(a, b)[1], world.shard(x), world.shard(y))
        if s["plant"] != "no_allreduce":
            world.allreduce_grads(params)
        if s["plant"] == "sum_not_mean":               # forget the 1/N: the planted error of the tests
            for p in params:
                p.grad = p.grad * world.size
        norms.append(float(clip_grad_norm(params, s["grad_clip"])))   # the global norm, before clipping
        losses.append(world.mean(loss.item()))
        opt.step()
        opt.zero_grad()
        with no_grad():
            evals.append(world.mean(model(world.shard(eval_x), world.shard(eval_y))[1].item()))
        n = step + 1
        if s["wait_sigint"]:
            if world.is_main:
                print(f"step {n}", flush=True)
            time.sleep(0.2)
        stopping = world.any(bool(stop))
        if world.is_main and s["ckpt"] and (n == s["save_at"] or stopping):
            save(s["ckpt"], model, opt, rng, n)
            saves += 1
        if stopping:
            if world.is_main:
                print(f"interrupted at step {n}: saved {saves} time(s)", flush=True)
            return 130
    synced = world.in_sync([p.data for p in params])
    if world.is_main and s["out"]:
        with open(s["out"], "w") as f:
            json.dump(dict(size=world.size, losses=losses, evals=evals, norms=norms, in_sync=synced), f)
    return 0


def guarded(argv):
    try:
        return main(argv)
    except ValueError as e:                           # as train.py: one line, exit status 2
        return fail(e)


if __name__ == "__main__":
    sys.exit(get_world().run(guarded, sys.argv[1:]))
