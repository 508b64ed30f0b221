"""Long work shows a progress bar on a terminal (examples done, rate, time left), and none in a
pipe or log, or with ``setdlm --quiet``. Run through a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from workflow_env import environ

SETDLM = str(Path(sys.executable).with_name("setdlm"))


def _on_a_terminal(argv: list[str], env: dict) -> tuple[int, str]:
    """Exit code and everything the command wrote to its terminal (stdout and stderr)."""
    leader, follower = pty.openpty()
    # A terminal of 100 x 30 characters (a new pseudo-terminal has none, and draws no bar).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    process = subprocess.Popen(argv, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def _eval(random_tiny: Path, out: Path) -> list[str]:
    return [
        *("eval", "gsm8k", "--model", str(random_tiny / "ar" / "model")),
        *("--out", str(out), "--limit", "3", "--warmup", "0", "--max-new-tokens", "4"),
    ]


@pytest.mark.slow
def test_an_evaluation_draws_a_bar_on_a_terminal_only(random_tiny, tmp_path, data_dir):
    env = environ(data_dir)
    # `setdlm --quiet` run in this process by an earlier test or fixture (on the same xdist
    # worker) leaves SETDLM_QUIET set for what it starts: this terminal is not quiet.
    env.pop("SETDLM_QUIET", None)
    code, screen = _on_a_terminal([SETDLM, *_eval(random_tiny, tmp_path / "a")], env)
    assert code == 0, screen
    bar = [line for line in screen.replace("\r", "\n").splitlines() if "3/3" in line]
    assert bar and "gsm8k" in bar[-1], screen
    assert "example/s" in bar[-1] or "s/example" in bar[-1]  # the rate
    assert "<" in bar[-1]  # elapsed<remaining

    code, screen = _on_a_terminal([SETDLM, "--quiet", *_eval(random_tiny, tmp_path / "b")], env)
    assert code == 0 and "3/3" not in screen

    piped = subprocess.run(
        [SETDLM, *_eval(random_tiny, tmp_path / "c")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0 and "3/3" not in piped.stderr + piped.stdout
