"""``setdlm check-speed`` (``make check``): a coarse guard on the decoding engine's own cost.

Absolute speed is never asserted: machines differ and shared ones drift by tens of percent
between minutes. What the guard compares is a ratio measured within one decode, the engine's
time outside the backbone over the backbone's time ((wall - forward) / forward, the ``host/fwd``
column of ``setdlm bench decode``). Both parts run on the same CPU at the same moment, so the
ratio moves much less than either time; it grows when the engine's per-step work grows (a
costlier confidence computation, more tensors built per step, a sync) and not when the
machine is slower overall.

The benchmark's random-weight models (``setdlm bench decode`` at 2 layers x 64, one thread,
the median of ``REPEATS`` decodes after a warm-up) decode each family at its τ values, and
each ratio must stay within ``FACTOR`` times the committed reference
(``results/baselines/engine_speed.json``). ``FACTOR`` is coarse on purpose: it catches a
doubled step cost, not a 10 % one; measure those with ``setdlm bench decode --against REV``.
``--write`` records a new reference (with the machine it was measured on).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

from setdlm.util.errors import UserError
from setdlm.util.files import atomic_write_json, read_json

FORMAT = 1
DEFAULT_BASELINE = Path("results/baselines/engine_speed.json")
FACTOR = 1.5
REPEATS = 5
SIZE = {"num_layers": 2, "hidden_size": 64}  # small: the engine's share of a step is largest


class SpeedCheckError(UserError, ValueError):
    """A speed reference that cannot be used."""


def measure(log=print) -> dict[str, float]:
    """``family/tau`` -> the engine's time over the backbone's, at one thread."""
    import torch

    from setdlm.recipes.bench import BenchSettings, bench_decode

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the backbone's share must not depend on the core count
    try:
        settings = BenchSettings(**SIZE, repeats=REPEATS)
        with torch.no_grad():
            rows = bench_decode(settings, log=log)
    finally:
        torch.set_num_threads(threads)
    return {f"{r.family}/{r.threshold:g}": r.host_per_forward for r in rows}


def write_reference(path: Path, ratios: dict[str, float]) -> None:
    import torch

    from setdlm.eval.fingerprint import hardware
    from setdlm.recipes.bench import BenchSettings

    atomic_write_json(
        path,
        {
            "format": FORMAT,
            "what": "engine time outside the backbone / backbone time, per family/tau",
            "factor": FACTOR,
            "settings": asdict(BenchSettings(**SIZE, repeats=REPEATS)),
            "written_with": {**hardware(torch.device("cpu")), "torch": torch.__version__},
            "host_per_forward": ratios,
        },
    )


def load_reference(path: Path) -> dict:
    reference = read_json(path, SpeedCheckError, "`setdlm check-speed --write` writes one")
    if not isinstance(reference, dict):
        reference = {}
    ratios = reference.get("host_per_forward")
    if reference.get("format") != FORMAT or not isinstance(ratios, dict) or not ratios:
        raise SpeedCheckError(f"{path}: not an engine speed reference of format {FORMAT}")
    from setdlm.results.baselines import ENGINE_SPEED, check_baseline

    return check_baseline(path, reference, ENGINE_SPEED, SpeedCheckError)


def compare(reference: dict, ratios: dict[str, float]) -> list[str]:
    """One line per variant over its bound or missing; empty when the engine passes."""
    factor = reference.get("factor", FACTOR)
    problems = []
    for key, expected in reference["host_per_forward"].items():
        if key not in ratios:
            problems.append(f"{key}: not measured (the reference has it)")
        elif ratios[key] > factor * expected:
            problems.append(
                f"{key}: engine time is {ratios[key]:.3f} of the backbone's, over {factor} x "
                f"the reference {expected:.3f}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    from setdlm.util.errors import ArgumentParser

    parser = ArgumentParser(
        prog="setdlm check-speed",
        description="the decoding engine's time per step relative to the backbone's, against "
        f"a committed reference (fails above {FACTOR} x; make check)",
    )
    parser.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
    parser.add_argument("--write", action="store_true", help="write the reference instead")
    args = parser.parse_args(argv)
    reference = None if args.write else load_reference(args.baseline)
    started = time.perf_counter()
    ratios = measure()
    if args.write:
        write_reference(args.baseline, ratios)
        print(f"wrote {args.baseline}: {len(ratios)} variants")
        return 0
    problems = compare(reference, ratios)
    for key, value in ratios.items():
        bound = reference["host_per_forward"].get(key)
        limit = "" if bound is None else f" (reference {bound:.3f})"
        print(f"{key:14s} host/forward {value:.3f}{limit}")
    seconds = time.perf_counter() - started
    if problems:
        print(
            f"setdlm check-speed: FAILED ({seconds:.0f} s, ATEN_CPU_CAPABILITY="
            f"{os.environ.get('ATEN_CPU_CAPABILITY', '(default)')}):"
        )
        for line in problems:
            print(f"  {line}")
        return 1
    print(
        f"setdlm check-speed: ok, every variant within {reference.get('factor', FACTOR)} x "
        f"its reference ({seconds:.0f} s)"
    )
    return 0
