"""Point the product pipeline at another dataset: ``python -m xmc.config.use_dataset NAME_OR_DIR``.

``make run DATASET=debian-relations`` calls this before ``dvc repro``: it sets ``data.dataset_dir`` in params.yaml
(the one line, comments kept, as ``dvc exp run -S data.dataset_dir=...`` would) to the folder itself, or to
``<datasets root>/NAME`` (default ``../shared/datasets``) when given a bare name. Everything else the dataset needs
is detected from its files (layout, label names, RAMEN's graph sets, the validation split). DVC's run cache keeps
each dataset's results, so switching back restores them without training again.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from xmc.errors import ConfigError
from xmc.io import atomic_file

_DATA_KEY = re.compile(r"^data:\s*(#.*)?$")
_DIR_KEY = re.compile(r"^(?P<indent>[ \t]+)dataset_dir:[ \t]*(?P<value>[^#\n]*?)(?P<rest>[ \t]*(#.*)?)$")


def resolve_dataset(name_or_dir: str, datasets_root: str | Path) -> str:
    """The dataset folder as params.yaml should hold it (relative paths stay relative to the repository root)."""
    if Path(name_or_dir).is_dir():
        return name_or_dir
    candidate = Path(datasets_root) / name_or_dir
    if "/" not in name_or_dir and candidate.is_dir():
        return candidate.as_posix()
    raise ConfigError(f"dataset {name_or_dir!r}: neither a folder nor a dataset under {datasets_root}/ "
                      f"(there: {', '.join(sorted(p.name for p in Path(datasets_root).glob('*') if p.is_dir())) or 'none'})")


def set_dataset_dir(params_path: str | Path, dataset_dir: str) -> bool:
    """Rewrite ``data.dataset_dir`` in ``params_path``; True when it changed."""
    path = Path(params_path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    in_data = False
    for i, line in enumerate(lines):
        if _DATA_KEY.match(line.rstrip("\n")):
            in_data = True
            continue
        if in_data and line.strip() and not line[0].isspace():
            break   # left the data section without finding the key
        m = _DIR_KEY.match(line.rstrip("\n")) if in_data else None
        if m:
            if m.group("value").strip() == dataset_dir:
                return False
            lines[i] = f"{m.group('indent')}dataset_dir: {dataset_dir}{m.group('rest')}\n"
            with atomic_file(path) as fh:
                fh.write("".join(lines))
            return True
    raise ConfigError(f"{path}: no data.dataset_dir key to set")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m xmc.config.use_dataset", description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", help="a dataset folder, or the name of one under --root")
    ap.add_argument("--root", default="../shared/datasets",
                    help="where bare dataset names are looked up (default: ../shared/datasets)")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args(argv)
    try:
        target = resolve_dataset(args.dataset, args.root)
        changed = set_dataset_dir(args.params, target)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{args.params}: data.dataset_dir {'set to' if changed else 'is already'} {target}")


if __name__ == "__main__":
    main()
