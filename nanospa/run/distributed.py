"""Data parallelism over processes: the one module that knows MPI (mpi4py) and NCCL.

    world()                   this process's World, made once: MPI's when launched by mpiexec
                              with two or more processes, else a single-process World whose
                              collectives do nothing (mpi4py is then not even imported)
    World.rank, .size, .local_rank, .is_main
    check_batch(batch_size)   DistributedError unless size divides it (raised on every rank,
                              before any collective)
    shard(x)                  this rank's contiguous slice of a global batch (axis 0)
    allreduce_grads(params)   every p.grad <- the mean over ranks, in flat buckets, fixed order
    mean(v), max(i), any(flag), bcast(obj), barrier(), in_sync(arrays)
    use_device(device)        "cuda": this rank's GPU (by its rank on the machine) and NCCL
    run(main), exit(status)   the end of a job: one failing rank must not leave others hanging
    run(main)                 (module level) world().run(main), a missing mpi4py as one line

The same run, faster (docs/distributed.md). Every rank draws the same global batch of B
sequences from the same seeded generator and trains on its contiguous slice of B / N. A
rank's loss is the mean over its B / N rows, and the loss of one process over all B rows is
the mean of those N equal-sized means, L = (1/N) sum_r L_r, so its gradient is (1/N) times
the sum of the ranks' gradients: allreduce_grads sums (MPI Allreduce, or NCCL on GPUs) and
scales by 1/N, and then every rank holds the same gradient and takes the same AdamW step.
Gradients travel in flat buckets of at most BUCKET_BYTES, in parameter order.

Faults (what mpich 5.0.2's hydra does, tests/test_distributed.py): a rank killed by a
signal makes mpiexec kill the others within a second; but a rank that merely exits with a
non-zero status leaves the others blocked in their next collective for ever (its own
MPI_Finalize waits for them too). So a failing rank goes through exit(status): it tells the
others (a message on a duplicate communicator), which are polling it in every collective
here (collectives are non-blocking requests, tested every POLL_S seconds) and stop with
one line naming it; if they have not all reached exit within EXIT_GRACE_S (a rank busy
elsewhere, or blocked in an NCCL kernel), it calls MPI_Abort, which ends the job.

Not here: the training loop (train.py), the threads inside a rank (run/threads.py),
devices and CuPy (backend.py), the measurement (bench/ranks.py).
"""
import atexit
import os
import pickle
import sys
import time
import traceback

import numpy as np

from .. import backend

BUCKET_BYTES = 16 * 2**20   # flat gradient buckets; a larger parameter travels alone
POLL_S = 1e-4               # a waiting collective tests its request this often (and yields the core)
EXIT_GRACE_S = 10.0         # how long a failing rank waits for the others to stop before MPI_Abort
FAIL_TAG = 77               # tag of the "I failed" message
# Set by the launchers: MPICH/Intel (hydra), Open MPI, MVAPICH, PMIx (srun --mpi=pmix).
LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
LAUNCHER_VARS = LAUNCHER_SIZE_VARS + ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


class DistributedError(ValueError):
    """A setting or environment that does not fit the processes of the job; one line."""


class PeerFailed(DistributedError):
    """Another rank failed; this one stops too (``status``: that rank's exit status)."""

    def __init__(self, rank, size, status):
        super().__init__(f"rank {rank} of {size} failed (exit status {status}); stopping this rank too")
        self.status = status


def launched_size(environ=os.environ):
    """Processes the launcher started, from its environment: None without a launcher."""
    if not any(v in environ for v in LAUNCHER_VARS):
        return None
    for v in LAUNCHER_SIZE_VARS:
        if environ.get(v, "").isdigit():
            return int(environ[v])
    return 0  # launched, size unknown: ask MPI


def buckets(params, limit_bytes=BUCKET_BYTES):
    """Consecutive runs of ``params`` (in their order), each of one dtype and at most
    ``limit_bytes`` of data; a parameter larger than that is a bucket alone."""
    out, size = [], 0
    for p in params:
        nbytes = p.data.nbytes
        if not out or size + nbytes > limit_bytes or p.data.dtype != out[-1][0].data.dtype:
            out.append([])
            size = 0
        out[-1].append(p)
        size += nbytes
    return out


_world = None


def run(main, *args):
    """sys.exit(run(main)): main(*args) -> exit status, in this process's World (see
    World.run); a World that cannot be made (mpi4py missing) is a one-line error, status 2."""
    try:
        w = world()
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return w.run(main, *args)


def world():
    """This process's World (made on the first call; DistributedError when mpiexec started
    several processes but mpi4py is missing)."""
    global _world
    if _world is None:
        n = launched_size()
        if n is None or n == 1:
            _world = World()
        else:
            try:
                from mpi4py import MPI
            except ImportError:
                raise DistributedError(f"started by mpiexec as one of {n or 'several'} processes, but "
                                       "mpi4py is not installed: pip install -e .[mpi]") from None
            _world = World(MPI.COMM_WORLD) if MPI.COMM_WORLD.Get_size() > 1 else World()
    return _world


class World:
    """The processes of a data-parallel job. World() is the single process (rank 0 of 1:
    every collective is the identity); World(comm) runs on an mpi4py communicator, also one
    of size 1 (the tests drive the real collectives that way)."""

    def __init__(self, comm=None):
        self.comm = comm
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        self.nonblocking = True          # False: plain blocking Allreduce (the benchmark compares)
        self.allreduce_seconds = 0.0     # host time spent in allreduce_grads (the benchmark reads it)
        self.peer_status = None          # set when another rank's failure was received
        self._nccl = None
        if comm is None:
            return
        from mpi4py import MPI
        self._MPI = MPI
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)  # the ranks on this machine
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self._exit_comm = comm.Dup()     # failure notices and the exit barrier, apart from the work
        self._notice_buf = np.zeros(2, np.int64)      # (status, rank) of a failed peer
        self._notice = self._exit_comm.Irecv(self._notice_buf, source=MPI.ANY_SOURCE, tag=FAIL_TAG)
        atexit.register(self._cancel_notice)          # runs before mpi4py's MPI_Finalize

    @property
    def is_main(self):
        """Rank 0 writes the log, the samples and the checkpoints, and shows progress."""
        return self.rank == 0

    def __repr__(self):
        return f"World(rank={self.rank}, size={self.size}, local_rank={self.local_rank})"

    # ---- the batch -----------------------------------------------------------------
    def check_batch(self, batch_size):
        """batch_size is the global batch: each rank trains batch_size / size sequences."""
        if batch_size % self.size:
            raise DistributedError(f"batch_size {batch_size} is not a multiple of the {self.size} processes "
                                   f"(each trains batch_size / {self.size} sequences of the global batch)")

    def shard(self, x):
        """Rows [rank * B / N, (rank + 1) * B / N) of a global batch x (B, ...)."""
        if self.size == 1:
            return x
        n = len(x) // self.size
        return x[self.rank * n:(self.rank + 1) * n]

    # ---- devices -------------------------------------------------------------------
    def use_device(self, device):
        """Before any array is made: on "cuda", GPU local_rank of this machine (one process
        per GPU) and, with several ranks, an NCCL communicator whose unique id rank 0 draws
        and broadcasts over MPI. A no-op on the CPU. Collective."""
        if device != "cuda" or self.comm is None:
            return
        cp = backend.cupy()
        if not backend.cuda_available():
            raise backend.DeviceError("device 'cuda' requested but CuPy sees no GPU")
        count = cp.cuda.runtime.getDeviceCount()
        if count < self.local_size and count != 1:  # one GPU each: a scheduler may show each only its own
            raise DistributedError(f"{self.local_size} processes on this machine but {count} GPUs: "
                                   "start at most one process per GPU")
        cp.cuda.Device(self.local_rank if count >= self.local_size else 0).use()   # before any array
        nccl = _nccl()
        uid = self.bcast(nccl.get_unique_id() if self.is_main else None)
        self._nccl = (nccl, nccl.NcclCommunicator(self.size, uid, self.rank))

    # ---- collectives ---------------------------------------------------------------
    def allreduce_grads(self, params):
        """p.grad <- (1/size) sum over ranks of p.grad, for every parameter: the gradient of
        the global-batch mean loss when each rank's loss is the mean over its shard. A
        parameter without gradient on every rank keeps None (as in one process); one that
        has it on some rank counts zero elsewhere. Buckets are filled and reduced in
        parameter order; device arrays go through NCCL on the current stream."""
        if self.comm is None:
            return
        t0 = time.perf_counter()
        params = list(params)
        present = np.array([p.grad is not None for p in params], np.int32)
        self._reduce(present, self._MPI.MAX)
        live = [p for p, has in zip(params, present) if has]
        pending = [self._start(bucket, self._pack(bucket)) for bucket in buckets(live)]
        for bucket, flat, request in pending:
            if request is not None:
                self._wait(request)
            flat *= 1.0 / self.size
            offset = 0
            for p in bucket:
                p.grad = flat[offset:offset + p.data.size].reshape(p.data.shape)  # views of flat
                offset += p.data.size
        self.allreduce_seconds += time.perf_counter() - t0

    def mean(self, value):
        """The mean over ranks of a float (evaluation losses: equal shards, so the global mean)."""
        if self.comm is None:
            return float(value)
        buf = np.array([value], np.float64)
        self._reduce(buf, self._MPI.SUM)
        return float(buf[0]) / self.size

    def max(self, value):
        """The largest of the ranks' integers: a signal number that reached some rank (0 for
        none), so that all ranks stop after the same step."""
        if self.comm is None:
            return int(value)
        buf = np.array([value], np.int64)
        self._reduce(buf, self._MPI.MAX)
        return int(buf[0])

    def any(self, flag):
        """True on every rank when ``flag`` is true on some rank."""
        return self.max(bool(flag)) > 0

    def bcast(self, obj):
        """Rank 0's ``obj`` on every rank (pickled: small things, a state_dict once)."""
        if self.comm is None:
            return obj
        data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8) if self.is_main else None
        n = np.array([data.size if self.is_main else 0], np.int64)
        self._wait(self.comm.Ibcast(n, root=0))
        buf = data.copy() if self.is_main else np.empty(int(n[0]), np.uint8)
        self._wait(self.comm.Ibcast(buf, root=0))
        return obj if self.is_main else pickle.loads(buf.tobytes())

    def barrier(self):
        if self.comm is not None:
            self._wait(self.comm.Ibarrier())

    def in_sync(self, arrays):
        """Whether every rank holds the same arrays (a float64 sum and sum of squares of each,
        compared by min and max over ranks): ranks that drift apart train different models."""
        if self.comm is None:
            return True
        sums = [backend.to_numpy(a).astype(np.float64) for a in arrays]
        fp = np.array([s.sum() for s in sums] + [(s * s).sum() for s in sums])
        lo, hi = fp.copy(), fp.copy()
        self._reduce(lo, self._MPI.MIN)
        self._reduce(hi, self._MPI.MAX)
        return bool(np.array_equal(lo, hi))

    def _reduce(self, buf, op):
        """In-place all-reduce of a small host array, polling for failed peers."""
        if self.nonblocking:
            self._wait(self.comm.Iallreduce(self._MPI.IN_PLACE, buf, op=op))
        else:
            self.comm.Allreduce(self._MPI.IN_PLACE, buf, op=op)

    def _pack(self, bucket):
        """The bucket's gradients in one flat array (zeros for a parameter without one here)."""
        xp = backend.xp_of(bucket[0].data)
        flat = xp.empty(sum(p.data.size for p in bucket), dtype=bucket[0].data.dtype)
        offset = 0
        for p in bucket:
            n = p.data.size
            flat[offset:offset + n] = p.grad.ravel() if p.grad is not None else 0
            offset += n
        return flat

    def _start(self, bucket, flat):
        """Start the sum over ranks of ``flat`` in place -> (bucket, flat, request or None)."""
        if backend.is_device_array(flat):
            if self._nccl is None:
                raise DistributedError("gradients on the GPU need World.use_device('cuda') first (NCCL)")
            nccl, comm = self._nccl
            kind = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64}[flat.dtype]
            comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, kind, nccl.NCCL_SUM,
                           backend.cupy().cuda.get_current_stream().ptr)
            return bucket, flat, None     # queued on the stream: later work on it waits for it
        if self.nonblocking:
            return bucket, flat, self.comm.Iallreduce(self._MPI.IN_PLACE, flat, op=self._MPI.SUM)
        self.comm.Allreduce(self._MPI.IN_PLACE, flat, op=self._MPI.SUM)
        return bucket, flat, None

    def _wait(self, request):
        """Wait for a request, testing it every POLL_S; a failed peer's notice raises PeerFailed."""
        while not request.Test():
            if self._notice is not None and self._notice.Test():
                self._notice = None
                self.peer_status = int(self._notice_buf[0])
                raise PeerFailed(int(self._notice_buf[1]), self.size, self.peer_status)
            time.sleep(POLL_S)

    def _cancel_notice(self):
        if self._notice is not None:
            self._notice.Cancel()
            self._notice.Wait()
            self._notice = None

    # ---- the end of a job ------------------------------------------------------------
    def run(self, main, *args):
        """main(*args) -> exit status, under the fault handling of exit(): an exception that
        escapes main prints its traceback and counts as status 1. Returns the status (when
        this process may exit normally)."""
        try:
            status = main(*args)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: B902 (KeyboardInterrupt too: the others must not hang)
            traceback.print_exc()
            status = 1
        return self.exit(status)

    def exit(self, status):
        """The end of this rank's part in the job. Status 0 (or one process): returns it, and
        MPI finalises at exit. Otherwise a rank that failed by itself tells the others first;
        then every rank waits at most EXIT_GRACE_S for all to arrive here, and leaves with
        os._exit (MPI_Finalize would wait for, or warn about, collectives the failure left
        half done); if they do not all arrive, MPI_Abort ends the job with this status."""
        status = int(status or 0)
        if self.comm is None or status == 0:
            return status
        status = self.peer_status if self.peer_status is not None else status
        if self.peer_status is None:  # failed by itself: the others may be waiting in a collective
            notice = np.array([status, self.rank], np.int64)
            for r in range(self.size):
                if r != self.rank:
                    self._exit_comm.Isend(notice, dest=r, tag=FAIL_TAG)
        barrier, deadline = self._exit_comm.Ibarrier(), time.monotonic() + EXIT_GRACE_S
        while not barrier.Test():
            if time.monotonic() > deadline:
                print(f"error: rank {self.rank} of {self.size}: the other ranks did not stop within "
                      f"{EXIT_GRACE_S:g} s; ending the job (MPI_Abort)", file=sys.stderr, flush=True)
                self.comm.Abort(status)
            time.sleep(POLL_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _nccl():
    """CuPy's NCCL bindings (cupy.cuda.nccl); DeviceError when this CuPy build has none."""
    try:
        from cupy.cuda import nccl  # ships with CuPy; usable only where NCCL was found
    except ImportError:
        nccl = None
    if nccl is None or not getattr(nccl, "available", True):
        raise backend.DeviceError("this CuPy finds no NCCL library (install NCCL, e.g. pip install nvidia-nccl-cu12)")
    return nccl
