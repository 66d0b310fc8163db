"""The end of a harness run: the results as JSON, the broken rules printed, the exit status."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def finish(results: Sequence[dict[str, Any]], json_path: Path | None, meta: dict[str, Any],
           failures: Callable[[dict[str, Any]], list[str]]) -> int:
    """
    Write C{meta} and C{results} to C{json_path} (if given), print one
    C{FAILED:} line per rule a result broke, and return the exit status
    (1 if any rule was broken, else 0).
    """
    if json_path:
        json_path.write_text(json.dumps({**meta, "results": list(results)}, indent=2))
    problems = [p for verdict in results for p in failures(verdict)]
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0
