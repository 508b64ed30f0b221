"""Stop a training cleanly when the scheduler says the job is about to end.

A cluster job ends early on preemption or at its time limit. SLURM can warn it first
(``sbatch --signal=USR1@120``: SIGUSR1 two minutes before the limit) and sends SIGTERM before
the final SIGKILL (after ``KillWait``, or a preemption's ``GraceTime``). The trainer watches
both: a signal only raises a flag, the training loop finishes the optimizer step under way,
writes a checkpoint and raises ``Preempted``; the command exits with ``EXIT_PREEMPTED``, and the
next attempt (a Snakemake retry, or SLURM's own requeue) resumes from that checkpoint with
bitwise the same result as an uninterrupted run.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass

# EX_TEMPFAIL of sysexits.h: "a temporary failure; the user is invited to retry".
EXIT_PREEMPTED = 75
# SIGINT (Ctrl-C) too: it used to kill the step under way with a traceback and lose up to a
# checkpoint interval; now it stops like SIGTERM (a second Ctrl-C still interrupts at once).
PREEMPTION_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """The training stopped at ``step`` on ``signal_name`` after saving its checkpoint."""

    def __init__(self, signal_name: str, step: int, checkpoint: str):
        super().__init__(
            f"{signal_name} received: saved step {step} to {checkpoint}; run the same command "
            f"again to resume from it"
        )
        self.signal_name = signal_name
        self.step = step
        self.checkpoint = checkpoint


@dataclass
class PreemptionFlag:
    """The first preemption signal received while watching (None: none yet)."""

    signal_name: str | None = None

    @property
    def raised(self) -> bool:
        return self.signal_name is not None


@contextmanager
def watch_preemption(signals=PREEMPTION_SIGNALS):
    """Within the block, ``signals`` set the yielded flag instead of ending the process; the
    previous handlers come back afterwards. Outside the main thread (where Python cannot
    install handlers) the flag never rises and signals keep their usual effect."""
    flag = PreemptionFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def record(signum, frame):
        if flag.signal_name is None:
            flag.signal_name = signal.Signals(signum).name
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: the user does not want to wait

    previous = {signum: signal.signal(signum, record) for signum in signals}
    try:
        yield flag
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
