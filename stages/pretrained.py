"""An off-the-shelf encoder as a method (zero-shot): models/<name>/ from a local folder.

Usage: ``python -m stages.pretrained <name>``; settings under params ``pretrained.<name>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.encoders import build_encoder
from xmc.errors import ConfigError
from xmc.io import atomic_dir


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    cfg = (load_params().get("pretrained") or {}).get(name)
    if cfg is None:
        raise ConfigError(f"params.yaml: no 'pretrained.{name}' section")
    enc = build_encoder(cfg["encoder"])
    with atomic_dir(Path("models") / name) as tmp:
        enc.save(tmp)
        (tmp / "train_summary.json").write_text(json.dumps({"train_seconds": 0.0}))


if __name__ == "__main__":
    run_entry_point(main)
