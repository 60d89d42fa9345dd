"""Run code in a fresh interpreter, for behaviour that depends on what a process imported first.

Example::

    >>> run_fresh_python("import sys, fxviews; print('torch._dynamo' in sys.modules)")
    'False\n'
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_fresh_python(code: str) -> str:
    """``code``'s stdout, run in a fresh interpreter on this checkout's fxviews."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
        check=True,
    )
    return done.stdout
