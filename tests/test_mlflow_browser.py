"""The MLflow UI in a real browser (issue 28): the link `setdlm ui` prints opens the main
experiment's speed-quality scatter, coloured by family, in zero clicks; the saved views show
the key metric columns; a copied results folder serves its own artifacts.

End-to-end tier (``make test-e2e``; .ci/run installs Debian's ``chromium`` and
``chromium-driver`` first). The store is a copy of the one the default run (``make run``)
wrote, when results/ holds one with this project's views; else the test writes the committed
reference results (results/reference/tiny/tables/arithmetic_pareto.csv) as result folders and
syncs them. Either way the UI runs on a copy in a temporary folder, on a free port, and the
test stops every process it started (the UI, its server, chromedriver, the browser). A
screenshot of each view is saved under build/ci-artifacts/mlflow-ui/ (git-ignored; or
$SETDLM_CI_ARTIFACTS/mlflow-ui/), and the test prints where.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow_helpers import free_port

from setdlm.families import family as family_info
from setdlm.results.reader import RESULTS_DIR_ENV, read_point
from setdlm.tracking.record import family_colour
from setdlm.tracking.views import VIEW_TAG_PREFIX, share_key
from setdlm.util.files import atomic_write_json

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
CONFIG, TASK = "tiny", "arithmetic-solve"  # the default run and its main experiment
REFERENCE_TABLE = REPO / "results" / "reference" / "tiny" / "tables" / "arithmetic_pareto.csv"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("SETDLM_CI_ARTIFACTS", REPO / "build" / "ci-artifacts"))
SCREENSHOTS = ARTIFACTS / "mlflow-ui"
WAIT_SECONDS = 90  # for the UI to start, a page to show its charts or table
KEY_METRICS = (
    "accuracy",
    "quality_low",
    "quality_high",
    "parallelism",
    "tokens_per_forward",
    "tokens_per_second",
    "nfe",
)


def _missing_browser() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).is_file():
            return f"{path} not found: apt-get install chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: make install"
    return None


@pytest.fixture(scope="module")
def browser_ready():
    reason = _missing_browser()
    if reason is not None:
        if os.environ.get("CI"):  # CI installs them: missing there is a failure, not a skip
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module", autouse=True)
def _stopped_by_a_timeout_too():
    """A timeout's SIGTERM ends the tests through their teardowns (Python's default would end
    the process at once, leaving the UI and the browser running)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    yield
    signal.signal(signal.SIGTERM, previous)


def _die_with_parent() -> None:
    """In a child, before it runs: Linux sends it SIGTERM when this process dies, even by
    SIGKILL, when no teardown can run."""
    import ctypes

    PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# The store: the default run's, copied, else the committed reference results synced.


def _default_run_store() -> Path | None:
    """The results folder (``$SETDLM_RESULTS_DIR``, else results/, as for `setdlm ui`) of a
    finished default run whose store holds this project's views."""
    root = Path(os.environ.get(RESULTS_DIR_ENV) or REPO / "results")
    database = root / "mlflow.db"
    if not (database.is_file() and (root / "runs" / CONFIG / TASK).is_dir()):
        return None
    key = VIEW_TAG_PREFIX + share_key(CONFIG, "charts")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            found = db.execute(
                "SELECT count(*) FROM experiment_tags t JOIN experiments e "
                "ON t.experiment_id = e.experiment_id WHERE t.key = ? AND e.name = ?",
                (key, TASK),
            ).fetchone()[0]
    except sqlite3.Error:
        return None
    return root if found else None


def _reference_results(root: Path) -> None:
    """The committed reference points of the main experiment as result folders (what the
    default run's metrics.json files hold that the UI shows; values from the reference table)."""
    with open(REFERENCE_TABLE, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["task"] == TASK]
    assert rows, f"{REFERENCE_TABLE} has no {TASK} rows"
    for row in rows:
        family = row["model"].split("-", 1)[0]
        own = family_info(family).default_policy.name
        decode = {"confidence_threshold": float(row["tau"] or 1e6)}
        if row["policy"] != own:
            decode["policy"] = row["policy"]
        quality = {
            "value": float(row["strict_match"]) / 100,
            "bootstrap_95": [float(row["strict_match_low"]) / 100,
                             float(row["strict_match_high"]) / 100],
        }  # fmt: skip
        metrics = {
            "config_hash": row["config_hash"],
            "config": {
                "task": TASK,
                "model_config": {"family": family},
                "model_source": f"results/runs/{CONFIG}/models/{row['model']}",
                "decode": decode,
            },
            "examples": int(row["examples"]),
            "quality": {"strict_match": quality},
            "speed": {
                "tokens_per_second_mean": float(row["tokens_per_second"]),
                "parallelism_mean": float(row["parallelism"]),
                "nfe_mean": float(row["nfe"]),
            },
        }
        atomic_write_json(root / "runs" / CONFIG / row["point"] / "metrics.json", metrics)


def _expected_points(runs: Path) -> dict[str, list[tuple[float, float]]]:
    """Family colour -> the (parallelism, accuracy) of its points (not the seeds' runs)."""
    expected = collections.defaultdict(list)
    for path in sorted((runs / TASK).glob("*/*/metrics.json")):
        point = read_point(path.parent, checked=False)
        quality = point.quality("strict_match")
        parallelism = point.speed("parallelism_mean")
        if quality is not None and parallelism is not None:
            expected[family_colour(point)].append((parallelism, quality))
    return dict(expected)


@pytest.fixture(scope="module")
def store(browser_ready, tmp_path_factory) -> dict:
    """A results folder with the store, copied away from where it was written."""
    work = tmp_path_factory.mktemp("mlflow-ui")
    copy = work / "copied" / "results"
    copy.mkdir(parents=True)
    default = _default_run_store()
    if default is not None:
        source = f"the default run's store, {default / 'mlflow.db'} (copied)"
        shutil.copy2(default / "mlflow.db", copy / "mlflow.db")
        shutil.copytree(default / "mlartifacts", copy / "mlartifacts")
        expected = _expected_points(default / "runs" / CONFIG)
    else:
        source = f"the reference results ({REFERENCE_TABLE.relative_to(REPO)}), synced"
        written = work / "written" / "results"
        _reference_results(written)
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        setdlm = str(Path(sys.executable).with_name("setdlm"))
        done = subprocess.run(
            [setdlm, "sync", str(written / "runs" / CONFIG)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        expected = _expected_points(written / "runs" / CONFIG)
        shutil.copy2(written / "mlflow.db", copy / "mlflow.db")
        shutil.copytree(written / "mlartifacts", copy / "mlartifacts")
        shutil.rmtree(written)  # the copy must stand on its own
    return {"results": copy, "expected": expected, "source": source, "work": work}


# The UI and the browser, each stopped whatever happens.


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


@pytest.fixture(scope="module")
def ui(store) -> dict:
    """`setdlm ui` on the copy: its base URL and the links it printed."""
    import psutil

    port = free_port()
    log_path = store["work"] / "setdlm-ui.log"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    command = [str(Path(sys.executable).with_name("setdlm")), "ui"]
    command += ["--results", str(store["results"]), "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    started: dict = {}  # every process of ours: setdlm ui's server and the server's workers
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # it then stops its server (cli.serve_until_stopped)
        )

    def note_children():
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(process.pid).children(recursive=True):
                started.setdefault(child.pid, child)

    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            note_children()
            with contextlib.suppress(OSError):
                if _get(f"{base}/health", timeout=2) == b"OK":
                    break
            assert process.poll() is None, f"setdlm ui ended: {log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no UI after {WAIT_SECONDS} s: {log_path}"
            time.sleep(0.5)
        note_children()
        printed = log_path.read_text()
        links = re.findall(r"^\s+(http://\S+)$", printed, flags=re.MULTILINE)
        assert links, printed
        yield {"base": base, "printed": printed, "links": links}
    finally:
        note_children()
        _stop(process, list(started.values()))


def _stop(process: subprocess.Popen, started: list) -> None:
    """setdlm ui stops its server's process group on SIGTERM; whatever of ours outlived it
    (only processes this test started) is killed."""
    import psutil

    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for child in started:
        with contextlib.suppress(psutil.Error):
            if _alive(child):
                child.kill()


@pytest.fixture(scope="module")
def browser(store):
    """Headless Chromium through chromedriver, quit (and killed if need be) at the end."""
    import psutil
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = store["work"] / "chromium-profile"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=2200,1150",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(argument)
    # chromedriver and the browser it starts in a process group of their own
    popen = {"start_new_session": True, "preexec_fn": _die_with_parent}
    log = str(store["work"] / "chromedriver.log")
    service = Service(CHROMEDRIVER, log_output=log, popen_kw=popen)
    driver = webdriver.Chrome(service=service, options=options)
    started = [psutil.Process(service.process.pid)]
    watchdog = subprocess.Popen(  # stops that group should this process be killed outright
        [sys.executable, "-c", WATCHDOG, str(service.process.pid)], preexec_fn=_die_with_parent
    )
    try:
        started += started[0].children(recursive=True)
        driver.set_page_load_timeout(WAIT_SECONDS)
        driver.set_script_timeout(30)
        yield driver
    finally:
        with contextlib.suppress(Exception):
            started += started[0].children(recursive=True)
        with contextlib.suppress(Exception):
            driver.quit()
        if any(_alive(process) for process in started):  # so the group is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started[0].pid, signal.SIGKILL)  # chromedriver and the browser
        for process in started:
            with contextlib.suppress(psutil.Error):
                if _alive(process):
                    process.kill()
        watchdog.kill()  # SIGKILL: its handler does not run
        watchdog.wait()


# The browser outlives chromedriver: should the test process be killed outright (no teardown
# runs then), this watchdog gets SIGTERM from Linux and kills chromedriver's process group,
# which the browser is in.
WATCHDOG = """
import os, signal, sys, time
def stop(signum, frame):
    try:
        os.killpg(int(sys.argv[1]), signal.SIGKILL)
    finally:
        os._exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(60)
"""


def _alive(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _open(driver, url: str, name: str, ready_script: str, *args):
    """Load ``url`` and wait until ``ready_script`` returns something truthy; that value. A
    page that never gets there fails the test with its text and a screenshot."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    try:
        return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.5).until(
            lambda d: d.execute_script(ready_script, *args)
        )
    except TimeoutException:
        shot = _screenshot(driver, f"failed-{name}")
        text = driver.execute_script("return document.body.innerText")
        pytest.fail(f"{url} not ready after {WAIT_SECONDS} s (screenshot {shot}):\n{text[:3000]}")


def _screenshot(driver, name: str) -> Path:
    """Close the MLflow assistant (it opens itself on a first visit), then save the page."""
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
        with contextlib.suppress(Exception):
            button.click()
    time.sleep(1)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def _view_name(driver) -> str:
    return driver.execute_script(
        "const b = document.querySelector('[data-testid=saved-views-trigger]');"
        "return b ? b.innerText : '';"
    )


SCATTERS = """
const plots = [...document.querySelectorAll('.js-plotly-plot')];
const found = plots.map(p => ({
  x: p.layout && p.layout.xaxis && p.layout.xaxis.title && p.layout.xaxis.title.text,
  y: p.layout && p.layout.yaxis && p.layout.yaxis.title && p.layout.yaxis.title.text,
  traces: (p.data || []).filter(t => t.type === 'scatter').map(t => ({
    x: t.x, y: t.y, colors: t.marker && t.marker.color,
    names: (t.customdata || []).map(c => c[1])}))}))
  .filter(p => p.traces.length && p.traces[0].x && p.traces[0].x.length >= arguments[0]);
return found.length >= 2 ? found : null;
"""

TABLE = """
const ids = [...document.querySelectorAll('.ag-header-cell[col-id]')]
  .map(e => e.getAttribute('col-id'));
const text = document.body.innerText;
const shown = arguments[0].every(id => ids.includes(id));
return shown && arguments[1].every(t => text.includes(t)) ? {ids: ids, text: text} : null;
"""


def test_the_printed_link_opens_the_speed_quality_scatter_coloured_by_family(
    store, ui, browser, capsys
):
    start = time.monotonic()
    expected = store["expected"]
    total = sum(len(points) for points in expected.values())
    assert len(expected) == 4, expected  # AR, MDLM, BD3LM, SetDLM: four colours
    first = ui["links"][0]
    assert f"Open {TASK}, " in ui["printed"] and first.startswith(ui["base"])
    assert "workflowType=machine_learning" in first and "compareRunsMode=CHART" in first

    # Zero clicks: the link itself opens the charts, every point, coloured by family.
    plots = _open(browser, first, "charts", SCATTERS, total)
    shots = {"charts": _screenshot(browser, "1-speed-quality-charts")}
    assert "/runs?" in browser.current_url and "machine_learning" in browser.current_url
    assert "vs speed" in _view_name(browser) and "higher is better" in _view_name(browser)
    by_axes = {(p["x"], p["y"]): p["traces"] for p in plots}
    for x in ("parallelism", "tokens_per_second"):
        (trace,) = by_axes[(x, "accuracy")]  # MLflow draws a scatter as one trace
        # one series per family: its colour, its points, no other run
        series = collections.defaultdict(list)
        for px, py, colour in zip(trace["x"], trace["y"], trace["colors"], strict=True):
            series[colour.lower()].append((px, py))
        assert {c: len(p) for c, p in series.items()} == {c: len(p) for c, p in expected.items()}
        assert not any("/seed-" in name for name in trace["names"])
    for colour, points in expected.items():  # the points themselves: (parallelism, accuracy)
        (trace,) = by_axes[("parallelism", "accuracy")]
        drawn = sorted(
            (px, py)
            for px, py, c in zip(trace["x"], trace["y"], trace["colors"], strict=True)
            if c.lower() == colour
        )
        assert all(
            math.isclose(a, b, rel_tol=1e-9)
            for pair, want in zip(drawn, sorted(points), strict=True)
            for a, b in zip(pair, want, strict=True)
        ), (colour, drawn, sorted(points))

    # The key metrics by family, as a table.
    # The key metrics by family, as a table: its columns, a group per family, every point.
    points_link = next(link for link in ui["links"] if "setdlm-tiny-points" in link)
    columns = [f"params.`{name}`" for name in ("model", "policy", "tau")]
    columns += [f"metrics.`{name}`" for name in KEY_METRICS]
    groups = [f"Group: {family}" for family in ("ar", "mdlm", "bd3lm", "setdlm")]
    texts = [f"{total} matching runs", *groups, "setdlm-smax8-arith/tau-0.1"]
    _open(browser, points_link, "points", TABLE, columns, texts)
    shots["points"] = _screenshot(browser, "2-key-metrics-by-family")

    # The sweeps, with their summaries: one row per curve (AR; MDLM; BD3LM with two policies;
    # SetDLM).
    sweeps_link = next(link for link in ui["links"] if "setdlm-tiny-sweeps" in link)
    columns = [
        f"metrics.`{name}`" for name in ("best_accuracy", "aup", "aup_tokens_per_forward", "points")
    ]
    _open(browser, sweeps_link, "sweeps", TABLE, columns, ["5 matching runs", "bd3lm-s4-arith"])
    shots["sweeps"] = _screenshot(browser, "3-sweeps")

    with capsys.disabled():
        print(f"\nMLflow UI on {store['source']}: {time.monotonic() - start:.0f} s in the browser")
        for name, path in shots.items():
            print(f"  screenshot of the {name} view: {path}")


def test_a_copied_results_folder_serves_its_own_artifacts(store, ui):
    """The store names no path of the machine that wrote it: mlflow-artifacts:/ locations,
    resolved against the copy's mlartifacts/ by the UI that `setdlm ui` started there."""
    base = ui["base"]
    by_name = f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name={TASK}"
    experiment = json.loads(_get(by_name))["experiment"]
    assert experiment["artifact_location"] == f"mlflow-artifacts:/{TASK}"
    search = urllib.request.Request(
        f"{base}/ajax-api/2.0/mlflow/runs/search",
        data=json.dumps(
            {
                "experiment_ids": [experiment["experiment_id"]],
                "filter": "tags.`setdlm.level` = 'point'",
                "max_results": 1,
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(search, timeout=10) as response:
        (run,) = json.loads(response.read())["runs"]
    run_id = run["info"]["run_id"]
    listed = json.loads(_get(f"{base}/ajax-api/2.0/mlflow/artifacts/list?run_uuid={run_id}"))
    assert "metrics.json" in {f["path"] for f in listed["files"]}
    served = _get(f"{base}/get-artifact?path=metrics.json&run_uuid={run_id}")
    relative = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:/")
    assert served == (store["results"] / "mlartifacts" / relative / "metrics.json").read_bytes()
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert json.loads(served)["config_hash"] == tags["setdlm.config_hash"]
