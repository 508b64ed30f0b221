"""Two revisions of this project decoding the same weights on one machine, interleaved.

``setdlm bench decode --against REV``: the checkout's working tree ("this") against git
revision REV ("that"), each in a worker process of its own (``revision_worker.py``) importing
its own code. The workers decode the benchmark's random-weight models (``bench_model``;
"that" loads the weights "this" built, so both compute with the same numbers) in turns,
this-that then that-this, for ``rounds`` rounds after one warm-up each; the ratio of a round is
this tok/s over that tok/s. Reported per variant: the median ratio and its range over rounds,
each side's engine host time per step ((wall - forward) / NFE), and whether the two produced
the same tokens. Speed drifts between minutes on a shared machine, the ratio of neighbouring
runs much less: compare ratios, never absolute times across runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from setdlm.families import FAMILY_NAMES
from setdlm.recipes.bench import BenchSettings, thresholds_of
from setdlm.util.git import git_output
from setdlm.util.validation import SettingError

WORKER = Path(__file__).with_name("revision_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RevisionRow:
    family: str
    threshold: float
    ratio: float  # median over rounds of this tok/s / that tok/s
    ratio_low: float
    ratio_high: float
    this_host_ms: float  # engine time per step outside the backbone, median over rounds
    that_host_ms: float
    forward_ms: float  # this side's backbone time per forward
    same_tokens: bool
    this_nfe: int
    that_nfe: int

    def line(self) -> str:
        tokens = "same" if self.same_tokens else "DIFFER"
        return (
            f"{self.family:7s} {self.threshold:8.3g} {self.ratio:7.3f} "
            f"[{self.ratio_low:5.3f}, {self.ratio_high:5.3f}] {self.this_host_ms:8.3f} "
            f"{self.that_host_ms:8.3f} {self.forward_ms:8.3f} {self.this_nfe:5d} "
            f"{self.that_nfe:5d}  {tokens}"
        )


HEADER = (
    f"{'family':7s} {'tau':>8s} {'ratio':>7s} {'range':>14s} {'host ms':>8s} {'was ms':>8s} "
    f"{'fwd ms':>8s} {'NFE':>5s} {'was':>5s}  tokens"
)


class _Worker:
    """A decoding process importing the setdlm of ``tree``."""

    def __init__(self, tree: Path, threads: int):
        env = {**os.environ, "SETDLM_BENCH_THREADS": str(threads), "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER.read_text()],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self._answer()
        where = Path(hello["setdlm"]).resolve()
        if not where.is_relative_to(tree.resolve()):
            self.close()
            raise SettingError(f"the worker for {tree} imported setdlm from {where}")

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise SettingError(f"a benchmark worker stopped (exit code {code}); see its stderr")
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def export_revision(revision: str, folder: Path) -> str:
    """Write ``revision``'s files into ``folder`` (no checkout, the repository is untouched);
    returns its full commit id."""
    commit = git_output(ROOT, "rev-parse", "--verify", f"{revision}^{{commit}}", check=False)
    if not commit or not commit.strip():
        raise SettingError(f"--against {revision!r}: not a commit of the checkout at {ROOT}")
    archive = folder / "revision.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", commit.strip()], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "tree", filter="data")
    archive.unlink()
    return commit.strip()


def compare_revisions(
    against: str, settings: BenchSettings, rounds: int = 5, threads: int = 1, log=print
) -> list[RevisionRow]:
    if rounds < 2:
        raise SettingError("--rounds: at least 2 (the ratio's range needs two rounds)")
    this_name = (git_output(ROOT, "describe", "--always", "--dirty", check=False) or "?").strip()
    with tempfile.TemporaryDirectory(prefix="setdlm-bench-") as scratch:
        scratch = Path(scratch)
        commit = export_revision(against, scratch)
        log(
            f"this: {ROOT} ({this_name}); that: {against} = {commit[:12]}; "
            f"{threads} thread(s), {rounds} rounds"
        )
        this, that = _Worker(ROOT, threads), None
        try:
            that = _Worker(scratch / "tree", threads)
            return _compare(this, that, settings, rounds, scratch, log)
        finally:
            this.close()
            if that is not None:
                that.close()


def _compare(this, that, settings, rounds, scratch: Path, log) -> list[RevisionRow]:
    shared = {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items()
    }
    rows = []
    log(HEADER)
    for family in FAMILY_NAMES:
        weights = str(scratch / f"{family}.pt")
        this.ask(op="model", family=family, settings=shared, weights=weights, save=True)
        that.ask(op="model", family=family, settings=shared, weights=weights, save=False)
        for threshold in thresholds_of(family, settings.thresholds):
            request = {"op": "decode", "family": family, "threshold": threshold, "settings": shared}
            for worker in (this, that):  # warm-up
                worker.ask(**request)
            mine, theirs = [], []
            for round_ in range(rounds):
                order = (this, that) if round_ % 2 == 0 else (that, this)
                for worker in order:
                    (mine if worker is this else theirs).append(worker.ask(**request))
            rows.append(_row(family, threshold, mine, theirs))
            log(rows[-1].line())
    return rows


def _row(family, threshold, mine: list[dict], theirs: list[dict]) -> RevisionRow:
    def speed(run):
        return run["tokens"] / run["wall"]

    def host_ms(runs):
        return 1000 * statistics.median((r["wall"] - r["forward"]) / r["nfe"] for r in runs)

    ratios = [speed(a) / speed(b) for a, b in zip(mine, theirs, strict=True)]
    return RevisionRow(
        family=family,
        threshold=threshold,
        ratio=statistics.median(ratios),
        ratio_low=min(ratios),
        ratio_high=max(ratios),
        this_host_ms=host_ms(mine),
        that_host_ms=host_ms(theirs),
        forward_ms=1000 * statistics.median(r["forward"] / r["nfe"] for r in mine),
        same_tokens=mine[0]["digest"] == theirs[0]["digest"],
        this_nfe=mine[0]["nfe"],
        that_nfe=theirs[0]["nfe"],
    )
