"""Tables, figures and the regression check, built from the result files of a run.

``setdlm report tables|figures RUN_DIR`` and ``setdlm check --baseline FILE RUN_DIR`` (see
``setdlm.report.cli``). The result files are the source; MLflow is only an index of them.
"""

from __future__ import annotations

from setdlm.report.cli import check_main, main

__all__ = ["check_main", "main"]
