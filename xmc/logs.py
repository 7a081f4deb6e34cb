"""Logging for the stages, the flows and the CLI: readable lines by default, JSON lines when asked.

``XMC_LOG_FORMAT=text`` (default): ``11:40:35 INFO  train dexml_bow | trained dexml_bow (dexml) in 29.6 s``;
``XMC_LOG_FORMAT=json``: one JSON object per line (``time``, ``level``, ``logger``, ``stage``, ``message``, and
``exception`` when there is one), for a log collector. Structured values go through :func:`kv`, never a dict repr.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

# libraries whose INFO lines say nothing to a person reading a stage's log
QUIET_LOGGERS = ("great_expectations", "faiss", "httpx", "httpcore", "urllib3", "filelock", "sentence_transformers",
                 "transformers", "numexpr", "matplotlib", "PIL", "fsspec", "asyncio", "dvclive")
FORMATS = ("text", "json")


def stage_name(argv: list[str] | None = None) -> str:
    """``train dexml_bow`` for ``python -m stages.train dexml_bow``; the program name otherwise."""
    argv = sys.argv if argv is None else argv
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = (spec.name if spec is not None and spec.name else os.path.basename(argv[0] if argv else "xmc"))
    name = name.removeprefix("stages.").removesuffix(".py")
    args = [a for a in argv[1:3] if not a.startswith("-")]
    return " ".join([name, *args[:1]])


def kv(values: Mapping[str, Any], digits: int = 2) -> str:
    """``P@1 68.6, P@5 41.32`` of a mapping: how a log line shows numbers by name."""
    def fmt(v: Any) -> str:
        return f"{v:.{digits}f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)
    return ", ".join(f"{k} {fmt(v)}" for k, v in values.items())


class TextFormatter(logging.Formatter):
    """``HH:MM:SS LEVEL stage | message`` (the logger name only at DEBUG, where it helps)."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage

    def format(self, record: logging.LogRecord) -> str:
        t = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        where = f"{self.stage} ({record.name})" if record.levelno <= logging.DEBUG else self.stage
        line = f"{t} {record.levelname:<7} {where} | {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonLinesFormatter(logging.Formatter):
    """One valid JSON object per record, whatever the message holds (quotes, newlines)."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "stage": self.stage, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class QuietLibraries(logging.Filter):
    """Drops the INFO and DEBUG records of :data:`QUIET_LOGGERS`, even where a library sets its own levels."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return not any(record.name == n or record.name.startswith(n + ".") for n in QUIET_LOGGERS)


def setup_logging(level: str | None = None, fmt: str | None = None, stage: str | None = None) -> None:
    """Root handler on stderr in the chosen format (``XMC_LOG_FORMAT``, ``XMC_LOG_LEVEL``); libraries at WARNING."""
    level = (level or os.environ.get("XMC_LOG_LEVEL") or "INFO").upper()
    if int(os.environ.get("RANK", "0") or 0) > 0:
        level = "WARNING"   # a data-parallel rank other than 0 trains in step with it: rank 0 tells the story
    fmt = (fmt or os.environ.get("XMC_LOG_FORMAT") or "text").lower()
    if fmt not in FORMATS:
        fmt = "text"
    stage = stage or stage_name()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLinesFormatter(stage) if fmt == "json" else TextFormatter(stage))
    handler.addFilter(QuietLibraries())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
