"""MLflow tracking: finished result folders mirrored into MLflow (the only package that imports
mlflow, and only inside ``sync`` and ``store.open_client``).

The result files are the source of truth; MLflow is the browsable index. Modules, in the order
a sync uses them: ``results`` (find finished folders, where the store lives), ``record`` (what
a folder looks like in MLflow), ``store`` (tracking URI, writer lock, reaching the store),
``sync`` (create or complete one run per config hash), ``cli`` (``setdlm sync`` / ``setdlm ui``).
"""

from setdlm.tracking.cli import sync_main, ui_main

__all__ = ["sync_main", "ui_main"]
