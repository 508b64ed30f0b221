"""Shared test settings: offline Hub, the local data mirror and the official-parity fixtures."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import slow_tests
import torch
from shared_build import built_once, claim, wait_for, xdist_worker
from slurm_guard import given_cluster, install_guard

# Tests never reach the Hugging Face Hub; the local mirror stands in for it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("SETDLM_DATA_DIR", str(REPO_ROOT.parent / "shared" / "data"))
DATA_DIR = Path(os.environ["SETDLM_DATA_DIR"])
PARITY_DIR = Path(
    os.environ.get("SETDLM_PARITY_DIR", DATA_DIR.parent / "fixtures" / "official-parity")
)
# Saturated confidences: large logits, so exact ties at 1.0 decide commits (their README).
SATURATED_PARITY_DIR = Path(
    os.environ.get(
        "SETDLM_SATURATED_PARITY_DIR", DATA_DIR.parent / "fixtures" / "official-parity-saturated"
    )
)
# No SLURM cluster given: every submitting command is refused for the whole session
# (subprocesses included), and a session in which anything tried fails (tests/slurm_guard.py).
SLURM_GUARD = None
if given_cluster() is None:
    SLURM_GUARD = install_guard(Path(tempfile.mkdtemp(prefix="setdlm-slurm-guard-")))
    os.environ["PATH"] = f"{SLURM_GUARD[0]}{os.pathsep}{os.environ.get('PATH', '')}"


def pytest_sessionfinish(session, exitstatus):
    if SLURM_GUARD is None:
        return
    refused = SLURM_GUARD[1].read_text().splitlines()
    shutil.rmtree(SLURM_GUARD[0].parent, ignore_errors=True)  # the guard's temporary folder
    if refused:
        print(f"\nthe suite tried to use a SLURM cluster it was not given: {refused}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


PARITY_CASES = sorted(p.name for p in PARITY_DIR.iterdir() if (p / "reference.json").exists())


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory) -> None:
    """setdlm's cache (the empty MLflow store each new store copies: setdlm/tracking/
    empty_store.py) in the session's temporary folder, shared by its pytest-xdist workers and
    every process they start; never the user's."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if xdist_worker() is not None else base
    os.environ["SETDLM_CACHE_DIR"] = str(shared / "setdlm-cache")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"SETDLM_DATA_DIR={DATA_DIR} is not a folder; point it at ../shared/data")
    return DATA_DIR


@pytest.fixture(scope="session")
def parity_dir() -> Path:
    if not PARITY_DIR.is_dir():
        pytest.fail(f"official-parity fixtures not found at {PARITY_DIR}; set SETDLM_PARITY_DIR")
    return PARITY_DIR


@pytest.fixture(scope="session")
def saturated_parity_dir() -> Path:
    if not SATURATED_PARITY_DIR.is_dir():
        pytest.fail(
            f"saturated official-parity fixtures not found at {SATURATED_PARITY_DIR}; "
            "set SETDLM_SATURATED_PARITY_DIR"
        )
    return SATURATED_PARITY_DIR


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # The fixtures were recorded with one thread; one thread also keeps CPU results bitwise stable.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# 80 steps: each family's held-out NLL drops by 0.77-0.85 nats (the tests ask for 0.5), in
# 13.6 s of training for the four on one core (AMD EPYC, 2026-12-07; 120 steps took about 20 s)
TINY_TEST_SETTINGS = dict(steps=80, hidden_size=64, new_tokens=12, num_prompts=2)
# The held-out likelihood before and after on 160 of the 952 chunks (drops of 0.79-0.85 nats):
# BD3LM and AR took 9.0 and 9.5 s so against 13.9 and 12.8 s on all of them (alternated, one
# AMD EPYC core, 2026-12-07).
TINY_HELDOUT_CHUNKS = 160


def pytest_collection_modifyitems(config, items):
    """A test that needs the trained tiny models (half a minute of training, once per session)
    belongs to the full suite only: the fast tier (``-m "not slow"``) runs the same mechanics on
    random-weight model folders (``random_tiny``). So does a test measured slow
    (tests/slow_tests.txt, written by tests/slow_tests.py)."""
    measured_slow = slow_tests.listed()
    for item in items:
        if "trained_tiny" in getattr(item, "fixturenames", ()) or item.nodeid in measured_slow:
            item.add_marker(pytest.mark.slow)
    _waiting_tests_first(items)


# The end-to-end tier's costliest modules, started right after the SLURM test, longest first,
# so that the short modules fill the end on both workers (seconds in CI on 2 AMD EPYC cores,
# 2026-12-07: fault injection 280, fault interrupts 253, workflow 81, shards 71; the next is 30).
# Alphabetically the workflow module came last, alone on one worker for 40 s at the end.
E2E_LONGEST_FIRST = (
    "tests/test_fault_injection.py",
    "tests/test_fault_interrupts.py",
    "tests/test_workflow.py",
    "tests/test_shards.py",
)


def _waiting_tests_first(items) -> None:
    """The SLURM tests first, then the longest end-to-end modules (above), the others in their
    order. The SLURM test spends most of its 2.5 minutes waiting for the executor plugin's polls
    (10 s more after each poll that finds nothing finished): started first, its worker's idle
    core serves the other worker's workflow runs. Distributed by test count (pytest-xdist's
    default, which `make test-e2e` turns off for this order), it started among the last modules,
    and in one CI run the tier ended 12 s after its last SLURM job. A stable sort: each module
    stays whole."""

    def start_rank(item) -> tuple[bool, int]:
        module = item.nodeid.split("::")[0]
        rank = E2E_LONGEST_FIRST.index(module) if module in E2E_LONGEST_FIRST else 99
        return item.get_closest_marker("slurm") is None, rank

    items.sort(key=start_rank)


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory) -> Path:
    """The four tiny families trained on WikiText-2 by the main job's code (once per test
    session, about 20 s on one core): ``<dir>/<family>/model`` holds each model and
    its tokenizer, ``<dir>/<family>/metrics.json`` its training and held-out figures. The
    pytest-xdist workers of a session share one folder and train its families between them,
    each family once (a family's training depends on its own seed only)."""
    from setdlm.recipes.tiny import TinySettings, run_tiny

    settings = TinySettings(**TINY_TEST_SETTINGS)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # session fixtures run before the per-test thread setting
    try:
        worker = xdist_worker()
        if worker is None:  # no workers: this process trains them all
            out = tmp_path_factory.mktemp("tiny")
            run_tiny(out, settings, log=lambda *args: None, heldout_chunks=TINY_HELDOUT_CHUNKS)
            return out
        out = tmp_path_factory.getbasetemp().parent / "trained-tiny"  # the workers' common
        _train_tiny_shared(out, settings, worker)
        return out
    finally:
        torch.set_num_threads(previous)


SHARED_TRAINING_WAIT_S = 900  # a worker waits this long for the others' families
# The tiny families by their training time on one core (AMD EPYC, 2026-12-07, 80 steps: bd3lm
# 4.4 s, setdlm 4.0, ar 2.9, mdlm 2.4), costliest first.
TINY_COST_ORDER = ("bd3lm", "setdlm", "ar", "mdlm")


def _train_tiny_shared(out: Path, settings, worker: int) -> None:
    """The tokenizer first, made once; then each worker claims the families no other worker
    has claimed (an exclusive create), trains them, and waits for the rest; the last step, the
    summary, is written by every worker with the same content."""
    from setdlm.data.text import load_wikitext2
    from setdlm.families import FAMILY_NAMES
    from setdlm.recipes.tiny import run_tiny, tiny_tokenizer, write_tiny_summary

    out.mkdir(exist_ok=True)
    built_once(
        out / "tokenizer",
        lambda folder: tiny_tokenizer(folder, load_wikitext2().train, settings),
        "the tiny tokenizer",
        SHARED_TRAINING_WAIT_S,
    )
    # The costliest first, the second worker from the second: both train from the first
    # minute and end together (6.8 and 6.9 s of training with the times above, against 5.3 and
    # 8.4 s when they take the table's order from either end).
    assert sorted(TINY_COST_ORDER) == sorted(FAMILY_NAMES)
    order = TINY_COST_ORDER[worker % 2 :] + TINY_COST_ORDER[: worker % 2]
    for family in order:
        if claim(out / f".{family}.claim"):
            run_tiny(
                out,
                settings,
                families=(family,),
                log=lambda *a: None,
                write_summary=False,
                heldout_chunks=TINY_HELDOUT_CHUNKS,
            )
    done = [out / family / "metrics.json" for family in FAMILY_NAMES]
    wait_for(done, "the tiny families another worker trains", SHARED_TRAINING_WAIT_S)
    write_tiny_summary(
        out, {f: json.loads((out / f / "metrics.json").read_text()) for f in FAMILY_NAMES}
    )


# The fault injection's runs (tests/test_fault_injection.py, tests/test_fault_interrupts.py):
# the undisturbed run, made once per session (tests/fault_runs.py), and a fault's own copy of it.
@pytest.fixture(scope="session")
def undisturbed(tmp_path_factory, data_dir) -> Path:
    from fault_runs import undisturbed_run

    return undisturbed_run(tmp_path_factory, data_dir)


@pytest.fixture
def faulted(undisturbed, tmp_path) -> Path:
    from workflow_env import copy_of_run

    return copy_of_run(undisturbed, tmp_path)


@pytest.fixture(scope="session")
def random_tiny(tmp_path_factory) -> Path:
    """The four tiny families with their initial (random) weights, laid out as
    ``trained_tiny`` (``<dir>/<family>/model`` with the tiny BPE tokenizer), for the tests of
    mechanics (runs, resumption, stops, scoring) that need a model folder, not a trained model:
    their outputs are noise, which those tests do not read."""
    from setdlm.checkpoints.folders import save_model
    from setdlm.data.text import load_wikitext2
    from setdlm.families import FAMILY_NAMES
    from setdlm.recipes.tiny import TinySettings, build_tiny_model, tiny_tokenizer

    out = tmp_path_factory.mktemp("random-tiny")
    settings = TinySettings(**TINY_TEST_SETTINGS)
    tokenizer = tiny_tokenizer(out / "tokenizer", load_wikitext2().train, settings)
    for family in FAMILY_NAMES:
        folder = out / family / "model"
        save_model(build_tiny_model(family, tokenizer, settings), folder)
        tokenizer.save_pretrained(folder)
    return out
