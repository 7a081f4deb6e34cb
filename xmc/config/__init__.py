"""Parameters, logging and the offline environment shared by every entry point."""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
import time
import traceback
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from xmc.config.params import validate_params
from xmc.config.schema import ParamsError
from xmc.errors import ConfigError, XMCError
from xmc.io import pid_alive, protect_inputs
from xmc.logs import setup_logging as _setup
from xmc.yaml12 import DuplicateKey, fast_yaml_loader, line_of, yaml_key_lines

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


MAX_PARAMS_BYTES = 4 << 20


def read_params_file(path: str | Path) -> tuple[Any, dict[tuple[str, ...], int]]:
    """A params file parsed (YAML 1.2 booleans, as DVC reads it) with the line of every key; one-line errors."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: params file not found (run from the repository root)")
    if p.stat().st_size > MAX_PARAMS_BYTES:
        raise ConfigError(f"{p}: {p.stat().st_size} bytes; a params file over {MAX_PARAMS_BYTES >> 20} MiB is refused")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start})") from None
    try:
        return yaml.load(text, Loader=fast_yaml_loader()), yaml_key_lines(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except DuplicateKey as e:
        raise ConfigError(f"{p}:{e.line}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply") from None


def problems_error(path: str | Path, lines: dict[tuple[str, ...], int], problems: list) -> ConfigError:
    """One line per problem: ``<file>:<line>: <key path>: <problem>``."""
    msgs = []
    for loc, msg in problems:
        line = line_of(lines, loc)
        key = ".".join(str(x) for x in loc) or "(top level)"
        msgs.append(f"{path}:{line}: {key}: {msg}" if line else f"{path}: {key}: {msg}")
    return ConfigError("\n".join(msgs))


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    """The product's ``params.yaml`` checked (:func:`xmc.config.params.validate_params`): typed, ranges checked,
    defaults filled, every run resolved against its method's defaults. Every problem is one line:
    ``params.yaml:<line>: <key path>: <problem>``."""
    raw, lines = read_params_file(path)
    try:
        params = validate_params(raw)
    except ParamsError as e:
        raise problems_error(path, lines, e.problems) from None
    # no stage may write into, over or around its source data
    graph = params["graph"]
    protect_inputs(params["data"]["dataset_dir"], graph["wordnet_dir"], graph["source_dir"])
    return params


def setup_logging(level: str = "INFO") -> None:
    """The stages' logging (:func:`xmc.logs.setup_logging`): readable lines, or JSON lines with XMC_LOG_FORMAT=json."""
    _setup(level)


# Exit codes a scheduler can act on: an input error is deterministic (a retry gives the same error),
# a resource or environment error may pass.
EXIT_INPUT_ERROR = 2
EXIT_RESOURCE_ERROR = 3
EXIT_INTERRUPTED = 130


def describe_error(e: BaseException) -> tuple[str, int]:
    """(one line for a person, exit code) for any exception a stage can raise."""
    def one_line(s: str) -> str:
        s = " ".join(str(s).split())
        return s if len(s) <= 500 else s[:497] + "..."

    if isinstance(e, XMCError):
        return one_line(str(e)) if "\n" not in str(e) else str(e), EXIT_INPUT_ERROR
    if isinstance(e, MemoryError):
        return "out of memory (lower batch sizes, index.encode_batch_size or the data size)", EXIT_RESOURCE_ERROR
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(e, OSError):
        where = e.filename if e.filename is not None else ""
        what = e.strerror or type(e).__name__
        resource = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.EAGAIN)
        return one_line(f"{where}: {what}" if where else what), EXIT_RESOURCE_ERROR if resource else EXIT_INPUT_ERROR
    if isinstance(e, UnicodeDecodeError):
        return one_line(f"not UTF-8 text ({e.reason} at byte {e.start})"), EXIT_INPUT_ERROR
    if isinstance(e, json.JSONDecodeError):
        return one_line(f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"), EXIT_INPUT_ERROR
    if isinstance(e, (zipfile.BadZipFile, zlib.error, EOFError)):
        return one_line(f"a corrupt or truncated archive ({type(e).__name__}: {e}); rerun the stage that wrote it"), \
            EXIT_INPUT_ERROR
    if isinstance(e, RecursionError):
        return "input nested too deeply", EXIT_INPUT_ERROR
    text = str(e)
    if isinstance(e, RuntimeError) and ("out of memory" in text.lower() or "CUDA error" in text):
        return one_line(text.splitlines()[0] if text else "device error"), EXIT_RESOURCE_ERROR
    return one_line(f"{type(e).__name__}: {text}" if text else type(e).__name__) + \
        " (set XMC_DEBUG=1 or pass --debug for the traceback)", 1


def _watch_parent() -> None:
    """Under ``dvc repro`` (``DVC_STAGE`` set) or torchrun: stop when dvc (or the launcher) dies. A ``kill -9`` of dvc would otherwise leave
    this stage running as an orphan next to the writer a rerun starts. Outputs are atomic, so stopping
    here leaves only temporaries, which the next run removes."""
    def parent_chain() -> list[int]:
        chain = [os.getppid()]
        try:  # dvc runs the command through $SHELL -c; if the shell did not exec, watch dvc behind it
            comm = Path(f"/proc/{chain[0]}/comm").read_text().strip()
            if comm in ("sh", "bash", "dash", "zsh", "ksh"):
                stat = Path(f"/proc/{chain[0]}/stat").read_text()
                chain.append(int(stat.rsplit(")", 1)[1].split()[1]))
        except (OSError, ValueError, IndexError):
            pass
        return chain

    watched = parent_chain()

    def loop() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != watched[0] or not all(pid_alive(p) for p in watched):
                print("error: the dvc process running this stage is gone: stopping", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=loop, name="xmc-parent-watch", daemon=True).start()


def run_entry_point(main: Callable[[], None], finish: Callable[[int], None] | None = None) -> None:
    """Run a stage's main: any failure becomes one line on stderr (``error: ...``) and an exit code that says
    whether retrying can help (2: input, 3: resource, 1: other). ``--debug`` or ``XMC_DEBUG=1`` re-raises.

    ``finish(code)``, when given, is called with the exit code once main has returned or failed; it may end the
    process itself (a torchrun rank: :func:`xmc.ranks.exit_rank`)."""
    set_offline_env()
    setup_logging(os.environ.get("XMC_LOG_LEVEL", "INFO"))
    debug = os.environ.get("XMC_DEBUG", "") not in ("", "0") or "--debug" in sys.argv
    if "--debug" in sys.argv:
        sys.argv.remove("--debug")
    # a stage under dvc stops when dvc dies; a rank under torchrun when its launcher dies (a kill -9 of torchrun
    # would otherwise leave the ranks training, and writing checkpoints, next to the rerun)
    if (os.environ.get("DVC_STAGE") or os.environ.get("TORCHELASTIC_RUN_ID")) and sys.platform.startswith("linux"):
        _watch_parent()
    code = 0
    try:
        main()
    except SystemExit as e:
        if finish is None:
            raise
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):   # what a normal exit would print
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - every failure is reported as one line
        if debug and finish is None:
            raise
        if debug:   # --debug under a finish hook: the traceback, then the hook's exit
            traceback.print_exc()
        msg, code = describe_error(e)
        for line in msg.splitlines():
            print(f"error: {line}", file=sys.stderr)
    if finish is not None:
        finish(code)
    if code:
        sys.exit(code)
