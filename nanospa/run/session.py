"""A training run's bookkeeping, for train.py: its settings on resume, its out_dir, its
processes and its signals, each behind one call, so that train.py shows the training.

    with Session(argv, defaults, presets, check, model_keys, derive) as run:
        run.settings            the command line over the defaults (--preset first), or on
                                resume over the checkpoint's own settings (a change to the run
                                refused unless --allow_changed names it: RESUME_KINDS); defaults that follow
                                other settings filled in on a scratch run (derive); checked (check), the
                                schedule made the run's (lr_decay_iters 0 -> the first max_iters)
        run.world               the processes (run/distributed.py; one without mpiexec)
        run.nothing_to_do       resume at max_iters (a line says so)
        run.begin(model, optimizer, rng, data)   -> (start, best_val, evaluate_now): restore
                                a checkpoint, or replace a held run and write iter 0's; the
                                log cut back to the checkpoint and opened for appending;
                                run.pending: the record of an evaluation a signal cut short,
                                which the resumed run completes first (else None)
        run.complete_pending(ev)   that record with its evaluation, logged
        run.steps()             the loop's iterations, start .. max_iters - 1; a signal ends them
        run.abandoning()        a context: in one process a signal inside drops the work at once
                                (a step's gradients, an evaluation); under MPI, the step finishes
        run.evaluation_of(record)   a context: a signal inside saves the state with `record`
                                (step n's) pending, for the resumed run to evaluate and log
        run.stop_point()        where every rank asks whether a signal came (a collective): an
                                evaluation's micro-batches, and between steps
        run.watch(n, loss, norm)   step n's loss and gradient norm: Diverged when non-finite
                                or exploded (EXPLODED); the best training loss kept
        run.log(record)         a record of log.jsonl (rank 0 writes)
        run.save(n, loss, state_loss)   the checkpoint of the state after n steps, written only
                                from a good state (GOOD: finite, and state_loss, its loss on step
                                n's batch, within GOOD x the best training loss); else a note
        run.last_good()         the checkpoint a message names
    run.signum, run.exit_status    after the `with`, reached only when a signal ended the loop:
                                the signal N, and 128 + N

One run per out_dir (run.lock), and SIGINT / SIGTERM handled from the start: before begin()
a signal stops at once, after it the run saves and stops (rundir.Interrupts). With eval_only
nothing is locked or written. The file formats and their checks live in rundir.py and
checkpoint.py; what a run does each step lives in train.py.

What a signal does to the loop is decided in one place, the Session's exit (_stopped). A
signal ends the loop with rundir.Abandoned: in one process raised at once inside
run.abandoning(), else at the next run.stop_point(), where every rank asks (a collective,
so that all of them stop at the same point). Leaving the `with`, the Session saves the
state after the last whole step n: with a step in progress, its batch wound back and its
gradients dropped (only .grad had changed); with step n's evaluation in progress, its log
record pending; not again when the state after n is saved already. It prints how to
continue, and suppresses the exception: train() goes on after its `with` and returns
128 + N. docs/running.md, "Exit status", says what each moment leaves.
"""
import math
import os
import signal
import sys
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import fields

from ..config import GPTConfig

from . import distributed
from .checkpoint import (CheckpointError, NotFiniteError, check_same_data, data_identity, load_checkpoint, restore,
                         save_checkpoint, training_state)
from .rundir import Abandoned, Interrupts, RunFiles, RunLock, check_run_dir, heal_log, held_files, last_record
from .settings import EXIT_SIGNAL_BASE, SettingsError, parse_settings

# What "diverged" and "good" mean (docs/running.md, "Exit status"). A model that guesses
# uniformly scores ln(vocab) nats per token. A loss above EXPLODED times that has exploded: the
# run stops (K-FAC at a runaway rate went on at 1e14 to 1e18). Spikes to 3x came back (a tiny
# PRepBN model at its switch to batch statistics), so the line sits well above them. A
# checkpoint is written only from a state whose loss on its step's batch is within GOOD times
# the best training loss so far, so a spike never replaces the checkpoint from before it.
EXPLODED = 10.0
GOOD = 2.0

# ----------------------------------------------------------------------------- what a resume may change
# A resumed run is the same run, or it is refused. Every setting of train.py is of one kind
# (tests/test_resume.py walks them all):
#   per_run  this command's own: never read from the checkpoint, never compared
#   free     cannot change what is trained or how it is evaluated: when the run stops, how often
#            it logs, evaluates and saves, the sample, and where and how fast it computes the same
#            model (device, threads, the attention's implementation: other roundings, same maths)
#   corpus   compared by what it reads: the sha256 of its tokens (--new_data=True allows another)
#   model    the model and the optimiser's kind, never changed on resume; compared as GPTConfig
#            resolves them (attention 'auto' is 'espa' there, final_norm 'auto' what it means)
#   run      what is trained and how it is evaluated (the batches, the schedule, the optimiser's
#            settings, the evaluation set, the seed K-FAC draws from, the dropout rate: a GPTConfig
#            field that adds no weights): refused by name unless --allow_changed names it, and
#            then noted in the log
# Every GPTConfig field not named here is of the kind model.
RESUME_KINDS = dict(
    per_run=("out_dir", "init_from", "overwrite", "new_data", "eval_only", "preset", "allow_changed"),
    free=("max_iters", "eval_interval", "log_interval", "checkpoint_interval", "sample_tokens", "start", "temperature",
          "top_k", "device", "threads", "attention_impl", "attention_block"),
    corpus=("data",),
    model=("tokenizer", "optimizer"),
    run=("batch_size", "grad_accum", "eval_iters", "seed", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters",
         "weight_decay", "beta1", "beta2", "grad_clip", "mup_base_width", "kfac_damping", "kfac_damping_mode",
         "kfac_ema", "kfac_inv_interval", "kfac_inverse_dtype", "kfac_momentum", "kfac_kl_clip", "kfac_fisher",
         "kfac_stats_fraction", "kfac_adam_lr_ratio", "muon_momentum", "muon_nesterov", "muon_ns_steps",
         "muon_adam_lr_ratio", "dropout"),
)
PER_RUN = RESUME_KINDS["per_run"]              # never from a checkpoint
EVALUATION = ("batch_size", "grad_accum", "eval_iters")   # they make the evaluation batches
CONFIG_FIELDS = tuple(f.name for f in fields(GPTConfig))


def _like(value, default):
    """Whether a checkpoint's setting has the type of train.py's default (an int for a float),
    finite where it is a number."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, type(default))


def resume_kind(key):
    """The kind of a train.py setting on resume (RESUME_KINDS), or None for an unknown key."""
    for kind, keys in RESUME_KINDS.items():
        if key in keys:
            return kind
    return "model" if key in CONFIG_FIELDS else None


def _resolved(cfg):
    """What each model field of a GPTConfig means: 'auto' fields as the config resolves them."""
    d = cfg.to_dict()
    d["final_norm"] = cfg.uses_final_norm
    return d


def resume_changes(s, ckpt, defaults, allowed=()):
    """Compare the settings of a resumed run with its checkpoint's. -> {key: (checkpoint's,
    now)} of the run's settings that change and `allowed` names; CheckpointError naming every
    model setting that changes (never allowed), then SettingsError naming every run setting
    that changes without being allowed. A setting the checkpoint does not record (written
    before it existed) is compared with its default: what the run did then."""
    saved = ckpt["settings"]
    before = lambda k: saved.get(k, defaults.get(k))
    model = [k for k in RESUME_KINDS["model"] if k in s and s[k] != before(k)]
    keys = [k for k in CONFIG_FIELDS if k in s and k != "vocab_size" and resume_kind(k) == "model"]
    try:
        old = _resolved(GPTConfig.from_dict(ckpt["config"]))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"its model configuration does not load ({e})") from None
    now = _resolved(GPTConfig.from_dict({**ckpt["config"], **{k: s[k] for k in keys}}))
    model += [k for k in keys if now[k] != old[k]]
    if model:
        shown = lambda k: f"{s[k]!r}" + (f" (= {now[k]!r})" if k in now and now[k] != s[k] else "")
        raise CheckpointError("the model cannot change on resume: " + ", ".join(
            f"{k}={shown(k)} (checkpoint: {(old[k] if k in old else before(k))!r})" for k in model))
    changed = {k: (before(k), s[k]) for k in RESUME_KINDS["run"] if k in s and s[k] != before(k)}
    refused = [k for k in changed if k not in allowed]
    if refused:
        raise SettingsError("resuming would change the run: " + ", ".join(
            f"{k}={s[k]!r} (checkpoint: {changed[k][0]!r})" for k in refused)
            + f"; pass --allow_changed={','.join(refused)} to change "
            + ("it" if len(refused) == 1 else "them") + " from here on (the log notes it), or start a new run "
            "in another --out_dir")
    return changed


def allowed_changes(spec, resuming):
    """--allow_changed=KEY[,KEY]: the run settings a resume may change; SettingsError for a key
    of another kind (naming why), or any key on a scratch run."""
    keys = [k.strip() for k in spec.split(",") if k.strip()]
    if keys and not resuming:
        raise SettingsError(f"--allow_changed={spec}: only a resumed run (--init_from=resume) changes settings")
    for k in keys:
        kind = resume_kind(k)
        if kind == "run":
            continue
        why = {None: "not a setting", "model": "the model's (a resumed run keeps its model)",
               "corpus": "the corpus (another one: --new_data=True)",
               "free": "free to change on resume anyway", "per_run": "this command's own"}[kind]
        raise SettingsError(f"--allow_changed={spec}: {k} is {why}; it takes the settings that change the run: "
                            + ", ".join(RESUME_KINDS["run"]))
    return tuple(keys)


class Diverged(RuntimeError):
    """A non-finite or exploded loss, gradient, parameter or optimiser state (exit status 1)."""


def settings_of(argv, defaults, presets):
    """--key=value over `defaults` by nanospa's one settings parser (run/settings.py): typed
    like the default, --preset=NAME first, a bare --flag for a bool key; SettingsError names
    a bad one."""
    s = parse_settings(argv, defaults, presets)
    del s["_explicit"]                                # not a setting: checkpoints store the rest
    return s


class Session:
    def __init__(self, argv, defaults, presets, check, model_keys, derive=None):
        self.argv, self.defaults, self.presets, self.check, self.model_keys = argv, defaults, presets, check, model_keys
        self.derive = derive            # derive(s, given): defaults that follow other settings (scratch runs)
        self.settings = settings_of(argv, defaults, presets)
        check_run_dir(self.settings["out_dir"], writing=not self.settings["eval_only"])   # refused now
        self.world = distributed.world()              # size 1 without mpiexec: every collective is a no-op
        self.ckpt, self.start, self.nothing_to_do = None, 0, False
        self._stack = ExitStack()
        # Where the loop is, for _stopped: the state's iteration n (after watch(n)), the step in
        # progress (None between steps) and the batch generator before its batch, the record of
        # an evaluation in progress, the iteration last saved, whether every rank has seen a signal.
        self.n, self.loss, self.it, self.drawn, self.record = 0, None, None, None, None
        self.saved_at, self._stop = None, False

    # ---- the settings, before any data is read --------------------------------------
    def __enter__(self):
        s, world = self.settings, self.world
        self.stop = self._stack.enter_context(Interrupts())
        if not s["eval_only"] and world.is_main:      # eval_only reads and writes nothing: no lock
            lock = self._stack.enter_context(RunLock(s["out_dir"]))
            for note in lock.notes:
                print(note, file=sys.stderr)
        try:
            self._resolve()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, kind, e, tb):
        try:
            if kind is not None and issubclass(kind, Abandoned) and self.stop.armed:
                self._stopped()                       # the one answer to a signal in the loop
                return True                           # train() goes on after its `with`: 128 + N
        finally:
            self.files.close()
            self._stack.close()

    def _resolve(self):
        s, world = self.settings, self.world
        out_dir = s["out_dir"]
        self.files = RunFiles(out_dir, writer=world.is_main)    # ckpt.npz and log.jsonl; rank 0 writes
        explicit = {a[2:].partition("=")[0] for a in self.argv}
        allowed = allowed_changes(s.get("allow_changed", ""), s["init_from"] == "resume")
        self.changed = {}
        if s["init_from"] == "resume":                # the checkpoint's settings, then the command line's
            self.ckpt = world.bcast(load_checkpoint(self.files.ckpt) if world.is_main else None)
            saved = {k: v for k, v in self.ckpt["settings"].items() if k in self.defaults and k not in PER_RUN}
            wrong = [k for k, v in saved.items() if not _like(v, self.defaults[k])]
            if wrong:                                 # they would type the command line's values too
                raise CheckpointError(f"{self.files.ckpt}: its settings hold " + ", ".join(
                    f"{k}={saved[k]!r}" for k in wrong) + ", not values train.py writes (of the type of its "
                    "default, finite): the file was edited or damaged; delete it or use --init_from=scratch")
            s = self.settings = settings_of(self.argv, {**self.defaults, **saved, "out_dir": out_dir}, self.presets)
            try:                                      # the same run, or refused (RESUME_KINDS)
                self.changed = resume_changes(s, self.ckpt, self.defaults, allowed)
            except SettingsError:
                if not s["eval_only"]:
                    raise
                self.changed = resume_changes(s, self.ckpt, self.defaults, RESUME_KINDS["run"])
                print("note: --eval_only=True evaluates the checkpoint with settings other than its run's ("
                      + ", ".join(f"{k}={new!r}, the run's {old!r}" for k, (old, new) in self.changed.items())
                      + "): the losses need not match its log", file=sys.stderr)
            except CheckpointError as e:
                raise CheckpointError(f"{self.files.ckpt}: {e}") from None
            self.start = int(self.ckpt["state"]["iter"])
        if not self.ckpt and self.derive is not None:
            given = explicit | set(self.presets.get(s["preset"], {}) if s["preset"] else ())
            self.derive(s, given)                     # e.g. K-FAC's own learning rate
        self.check(s, explicit, "from the checkpoint" if self.ckpt else "the default")
        world.check_batch(s["batch_size"])            # one line on every rank, before any collective
        if not world.is_main:
            sys.stdout = open(os.devnull, "w")        # rank 0 alone prints; errors still reach stderr
        if not s["eval_only"]:
            held = held_files(out_dir)
            if not self.ckpt and held and not s["overwrite"]:
                raise SettingsError(f"--out_dir={out_dir} holds a run ({', '.join(held)}): continue it with "
                                    f"--init_from=resume, choose another --out_dir, or replace it with --overwrite=True")
            if self.ckpt and s["max_iters"] < self.start:
                raise SettingsError(f"max_iters={s['max_iters']} is below the iteration of {self.files.ckpt} "
                                    f"({self.start}): a resumed run cannot go back; pass a larger --max_iters, "
                                    "or --eval_only=True")
            if self.ckpt and s["max_iters"] == self.start and not self.ckpt["state"].get("pending_record"):
                print(f"nothing to do: {self.files.ckpt} is at iter {self.start} = max_iters; pass --max_iters=N "
                      f"with N > {self.start} to train further")
                self.nothing_to_do = True
        # The schedule is the run's: lr_decay_iters=0 becomes this run's max_iters, stored so in the
        # checkpoint, so that a resumed run with a larger max_iters does not re-stretch the cosine.
        s["lr_decay_iters"] = s["lr_decay_iters"] or s["max_iters"]
        if (self.ckpt and s["lr_decay_iters"] < s["max_iters"] and "lr_decay_iters" not in explicit
                and not s["eval_only"] and not self.nothing_to_do):
            print(f"note: the schedule is the run's: its cosine decay ends at iter {s['lr_decay_iters']} "
                  f"(lr_decay_iters), so iters {max(self.start, s['lr_decay_iters'])}..{s['max_iters']} train "
                  f"at min_lr={s['min_lr']:g}; --lr_decay_iters={s['max_iters']} --allow_changed=lr_decay_iters "
                  "stretches it instead")

    # ---- the state: restored, or started ------------------------------------------------
    def begin(self, model, optimizer, rng, ds):
        """Restore the checkpoint's state (weights, optimiser, batch generator, iteration) on
        resume; cut the log back to it. -> (start, best validation loss, whether to evaluate
        the model before the first step: at init, and for eval_only)."""
        s, world, files = self.settings, self.world, self.files
        self.data = data_identity(ds.meta, s["data"])  # recorded in each checkpoint
        best_val, self.best_train, self.vocab_size = math.inf, math.inf, model.config.vocab_size
        self.pending = self.ckpt["state"].get("pending_record") if self.ckpt else None
        if self.ckpt:
            new = check_same_data(files.ckpt, self.ckpt["state"].get("data"), self.data, s["new_data"])
            self.start, best_val = restore(self.ckpt, optimizer, rng, model, files.ckpt)
            self.best_train = self.ckpt["state"].get("best_train_loss") or math.inf   # older checkpoints: none
            files.saved_iter = self.saved_at = self.start
            if new:
                best_val = math.inf
                print(f"note: --new_data=True: training on {ds.name}, not the checkpoint's corpus; the best "
                      "validation loss starts afresh")
            if self.changed and not s["eval_only"]:
                print(f"note: --allow_changed: from iter {self.start} on, " + ", ".join(
                    f"{k}={v!r} (was {was!r})" for k, (was, v) in self.changed.items())
                    + ("; the evaluation batches changed, so the best validation loss starts afresh"
                       if set(self.changed) & set(EVALUATION) else ""), file=sys.stderr)
                if set(self.changed) & set(EVALUATION):
                    best_val = math.inf
            print(f"resumed from {files.ckpt} at iter {self.start}")
        self.model, self.optimizer, self.rng, self.best_val, self.n = model, optimizer, rng, best_val, self.start
        if s["eval_only"]:
            return self.start, best_val, True
        self.stop.arm()                               # from here on a signal saves the state first
        kept, notes = heal_log(files.log_path, self.start) if self.ckpt and world.is_main else (0, [])
        for note in notes:
            print(note, file=sys.stderr)
        kept = world.bcast(kept)                      # whether to evaluate now must agree (a collective)
        if not self.ckpt and world.is_main:
            for name in held_files(s["out_dir"]):      # --overwrite=True: the old run goes now, not before
                os.remove(os.path.join(s["out_dir"], name))
        if not self.ckpt:
            self.save(0, None)                        # every run that started can be resumed
        files.open()
        if self.changed:                              # the log says where the run changed, and how, once:
            note = dict(iter=self.start, changed_on_resume={k: list(v) for k, v in self.changed.items()})
            if not world.is_main or last_record(files.log_path) != note:   # a resume cut short wrote it
                files.write(note)
        return self.start, best_val, (self.start == 0 and kept == 0) or self.pending is not None

    def complete_pending(self, ev):
        """The record of the evaluation a signal cut short (run.pending), with that evaluation
        `ev` now made: logged, its validation loss counted, and the checkpoint written again
        without it, so that a later resume from it (the run stopped before its next checkpoint,
        or it was the last step) does not log it twice; nothing with eval_only."""
        if self.pending and not self.settings["eval_only"]:
            self.best_val = min(self.best_val, ev["val_loss"])
            self.log(dict(self.pending, **ev))
            self.pending = None
            self.save(self.start, self.ckpt["state"].get("train_loss"))

    # ---- the files ---------------------------------------------------------------------
    def log(self, record, sync=False):
        self.files.write(record, sync=sync)

    def watch(self, n, loss, norm):
        """Step n's training loss (of the state before its update) and gradient norm: Diverged
        when either is non-finite or the loss is above EXPLODED ln(vocab); else the best kept."""
        if not (math.isfinite(loss) and math.isfinite(norm)):
            raise Diverged(f"non-finite loss or gradient at iter {n} (loss {loss}, gradient norm {norm}); "
                           f"stopped. Last good checkpoint: {self.last_good()}")
        limit = EXPLODED * math.log(self.vocab_size)
        if loss > limit:
            raise Diverged(f"the training loss exploded at iter {n}: {loss:.4g}, above {EXPLODED:g} ln(vocab) = "
                           f"{limit:.4g} (best {self.best_train:.4g}); stopped. Last good checkpoint: {self.last_good()}")
        self.best_train = min(self.best_train, loss)
        self.n, self.loss = n, loss                   # the update follows: no signal stops a step there

    def save(self, n, loss, state_loss=None, pending=None):
        """The checkpoint of the state after n steps, written only from a finite state and, when
        state_loss (its loss on step n's batch) is given, one within GOOD x the best training
        loss; else a note says which checkpoint stays (a non-finite state: Diverged, naming the
        first non-finite array). `pending`: the log record of step n, whose evaluation a signal
        cut short: stored, not logged; the resumed run evaluates and logs it. -> whether it was
        written."""
        self.saved_at = n                             # tried: a signal now finds the state as saved
        if state_loss is not None and math.isfinite(state_loss) and state_loss > GOOD * self.best_train:
            print(f"note: the state after iter {n} scores {state_loss:.4g} on its batch, above {GOOD:g} x the best "
                  f"training loss ({self.best_train:.4g}): not saved; {self.last_good()} stays", file=sys.stderr)
            return False
        try:
            self.files.save(n, lambda path: save_checkpoint(
                path, self.model, self.optimizer, self.settings, self.model.config,
                dict(training_state(n, self.best_val, self.rng, self.data, loss if state_loss is None else state_loss,
                                    self.best_train), pending_record=pending)))
        except NotFiniteError as e:
            raise Diverged(f"{e}; stopped. Last good checkpoint: {self.last_good()}") from None
        return True

    def last_good(self):
        return self.files.last_good()

    # ---- the loop's signals: the one place --------------------------------------------
    def steps(self):
        """The loop's iterations, start .. max_iters - 1. Before each, and after the last, every
        rank asks whether a signal came (stop_point): if one did, the loop ends there, with the
        state after the last step (_stopped)."""
        for it in range(self.start, self.settings["max_iters"] + 1):
            self.it = None                            # between steps
            self.stop_point()
            if it == self.settings["max_iters"]:
                return
            self.it, self.drawn = it, self.rng.bit_generator.state   # a dropped step draws its batch again
            yield it

    def abandoning(self):
        """Where a signal drops the work at once (a step's gradients, an evaluation): one process
        only, as the other ranks would wait for this one in their next collective."""
        return self.stop.abandoning() if self.world.size == 1 else nullcontext()

    @contextmanager
    def evaluation_of(self, record):
        """Inside, a signal saves the state with `record` (step n's log record) pending: the
        resumed run evaluates and logs it before its first step."""
        self.record = record
        yield
        self.record = None                            # not on an exception: _stopped reads it

    def stop_point(self):
        """rundir.Abandoned when a signal reached any rank: every rank calls it at the same points
        (between steps, between an evaluation's micro-batches), so that all of them stop there."""
        if self._stop or self._signalled():
            raise Abandoned(self.signum)

    def _signalled(self):
        """Whether SIGINT / SIGTERM reached any rank (a collective: max over the ranks)."""
        signum = self.world.max(self.stop.signum or 0)
        if signum:
            self.stop.signum, self._stop = signum, True
        return self._stop

    def _stopped(self):
        """A signal ended the loop (rundir.Abandoned): save the state after the last whole step
        n, and say how to continue. In step n + 1's gradients (one process) only .grad had
        changed: its batch is drawn again on resume. In step n's evaluation: its record is
        stored pending. After step n otherwise (its checkpoint's check of the state cut short, or
        between steps): the state as it is, unless it is saved already."""
        n = self.n
        if self.record is not None:
            self.save(n, self.loss, pending=self.record)
        elif self.it is not None and self.it == n:
            self.rng.bit_generator.state = self.drawn
            self.optimizer.zero_grad()
            self.save(n, None)
        elif self.saved_at != n:
            self.save(n, self.loss)
        if self.world.is_main:
            print(f"{signal.Signals(self.signum).name}: stopped at iter {n}, checkpoint saved to {self.files.ckpt}; "
                  f"continue with {self.files.resume}", file=sys.stderr)

    @property
    def signum(self):
        """The signal that stopped the run (this process's, or one another rank saw), or None."""
        return self.stop.signum

    @property
    def exit_status(self):
        """128 + N after signal N (docs/running.md)."""
        return EXIT_SIGNAL_BASE + self.signum
