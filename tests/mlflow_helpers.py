"""What the MLflow tests share: result folders written by hand (a finished point in the layout),
the runs a store holds for them, and `setdlm ui` started on a free port and always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient

from setdlm.eval.records import config_hash
from setdlm.tracking.record import IDENTITY_TAG
from setdlm.util.files import atomic_write_json


# ------------------------------------------------------------------------------ results
def write_point(
    root: Path, task, model, point, family, tau, quality, speed=None, seed=None, **extra
):
    """A finished point in the layout, <root>/runs/tiny/<task>/<model>/<point>[/seed-<k>]."""
    folder = root / "runs" / "tiny" / task / model / point
    if seed is not None:
        folder = folder / f"seed-{seed}"
    folder.mkdir(parents=True)
    headline = "nll" if task.startswith("likelihood-") else "strict_match"
    decode = None if tau is None else {"confidence_threshold": tau, **extra}
    config = {"task": task, "model_config": {"family": family}, "model_source": model}
    if decode is not None:
        config["decode"] = decode
    value, low, high = quality
    metrics = {
        "config_hash": config_hash([task, model, point, seed]),
        "config": config,
        "quality": {headline: {"value": value, "bootstrap_95": [low, high]}},
    }
    if speed is not None:
        tps, parallelism, nfe = speed
        metrics["speed"] = {
            "tokens_per_second_mean": tps,
            "parallelism_mean": parallelism,
            "nfe_mean": nfe,
        }
    atomic_write_json(folder / "metrics.json", metrics)
    (folder / "samples.jsonl").write_text('{"id": 0}\n')
    return folder


def write_small_results(root: Path) -> Path:
    """arithmetic-solve: SetDLM at τ = 0.1 and no threshold (one of them with a seed's own
    run), BD3LM at τ = 0.5 and with the dual cache, AR; likelihood: SetDLM and AR."""
    solve, likelihood = "arithmetic-solve", "likelihood-arithmetic"
    setdlm, bd3lm, ar = "setdlm-smax8-arith", "bd3lm-s4-arith", "ar-arith"
    points = [  # task, model, point, family, τ, quality (value, interval), speed (tok/s, ρ, NFE)
        (solve, setdlm, "tau-0.1", "setdlm", 0.1, (0.9, 0.8, 0.95), (900.0, 3.0, 7.0)),
        (solve, setdlm, "tau-1e+06", "setdlm", 1e6, (0.95, 0.9, 0.99), (300.0, 1.0, 21.0)),
        (solve, bd3lm, "tau-0.5", "bd3lm", 0.5, (0.8, 0.7, 0.9), (800.0, 2.0, 10.0)),
        (solve, ar, "tau-1e+06", "ar", 1e6, (0.99, 0.97, 1.0), (600.0, 1.0, 21.0)),
        (likelihood, setdlm, "default", "setdlm", None, (0.36, 0.35, 0.37), None),
        (likelihood, ar, "default", "ar", None, (0.34, 0.33, 0.35), None),
    ]
    for point in points:
        write_point(root, *point)
    write_point(root, *points[1][:6], (310.0, 1.0, 21.0), seed=2)
    dual = (solve, bd3lm, "dual-cache-tau-0.5", "bd3lm", 0.5, (0.85, 0.7, 0.9), (850.0, 2.0, 10.0))
    write_point(root, *dual, policy="dual-cache")
    return root


def result_runs(client: MlflowClient) -> dict[str, list]:
    """experiment name -> its result runs (Default and the sweeps' parent runs left out)."""
    experiments = [e for e in client.search_experiments() if e.name != "Default"]
    return {
        e.name: [
            run
            for run in client.search_runs([e.experiment_id], max_results=1000)
            if IDENTITY_TAG in run.data.tags
        ]
        for e in experiments
    }


# ------------------------------------------------------------------------------ servers
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def setdlm_ui(results: Path, port: int):
    """`setdlm ui` on ``results`` (its own process group), once its MLflow server answers;
    whatever of it outlives the test is killed, so that the suite leaves nothing running."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    ui = subprocess.Popen(
        [str(Path(sys.executable).with_name("setdlm")), "ui", "--results", str(results)]
        + ["--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not answers(f"http://127.0.0.1:{port}/health"):
            assert ui.poll() is None, "setdlm ui ended before its server answered"
            assert time.monotonic() < deadline, "the MLflow UI never answered"
            time.sleep(0.5)
        yield ui
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
        _kill_servers_on(port)


def stops_serving(ui: subprocess.Popen, stop: int, port: int) -> None:
    """``stop`` sent to setdlm ui alone (`kill`, a closed terminal; or `kill -9`, which it
    cannot catch) ends it, and with it its server and the server's workers."""
    ui.send_signal(stop)
    assert ui.wait(timeout=60) == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
    deadline = time.monotonic() + 30
    while listening(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not listening(port), f"something still listens on {port} after setdlm ui ended"


def _kill_servers_on(port: int) -> None:
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if "mlflow" in command and str(port) in command:
            with contextlib.suppress(psutil.Error):
                process.kill()
