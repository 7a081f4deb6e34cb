"""Parameters, logging and the offline environment shared by every entry point."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from xmc.errors import XMCError

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "False",
    "TOKENIZERS_PARALLELISM": "false",
}


def set_offline_env() -> None:
    """No network at run time: hubs offline, telemetry off (called by entry points, not on import)."""
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise XMCError(f"{p}: params file not found (run from the repository root)")
    with open(p, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format='{"time": "%(asctime)s", "level": "%(levelname)s", "logger": "%(name)s", "message": "%(message)s"}',
        stream=sys.stderr,
    )
    # third-party chatter that says nothing to a person reading a stage's log
    for name in ("great_expectations._docs_decorators", "faiss.loader", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_entry_point(main: Callable[[], None]) -> None:
    """Run a stage's main: errors meant for people become one line on stderr and exit 1."""
    set_offline_env()
    setup_logging(os.environ.get("XMC_LOG_LEVEL", "INFO"))
    try:
        main()
    except XMCError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
