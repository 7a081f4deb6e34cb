"""Point the product pipeline at another dataset: ``python -m xmc.config.use_dataset NAME_OR_DIR``.

``make run DATASET=debian-relations`` calls this before ``dvc repro``: it sets ``data.dataset_dir`` in params.yaml
(the one line, comments kept, as ``dvc exp run -S data.dataset_dir=...`` would) to the folder itself, or to
``<datasets root>/NAME`` (default ``../shared/datasets``) when given a bare name, and ``data.name`` (the outputs'
folder ``results/<name>/``) to the folder's name, or to ``--name``. Everything else the dataset needs is detected
from its files (layout, label names, RAMEN's graph sets, the validation split). Each dataset's outputs stay in its
own folder, so switching back finds them where they were (and DVC's run cache restores the cached ones).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from xmc.errors import ConfigError
from xmc.io import atomic_file
from xmc.workspace import results_dir

_DATA_KEY = re.compile(r"^data:\s*(#.*)?$")


def resolve_dataset(name_or_dir: str, datasets_root: str | Path) -> str:
    """The dataset folder as params.yaml should hold it (relative paths stay relative to the repository root)."""
    if Path(name_or_dir).is_dir():
        return name_or_dir
    candidate = Path(datasets_root) / name_or_dir
    if "/" not in name_or_dir and candidate.is_dir():
        return candidate.as_posix()
    raise ConfigError(f"dataset {name_or_dir!r}: neither a folder nor a dataset under {datasets_root}/ "
                      f"(there: {', '.join(sorted(p.name for p in Path(datasets_root).glob('*') if p.is_dir())) or 'none'})")


def set_dataset_dir(params_path: str | Path, dataset_dir: str, name: str | None = None) -> bool:
    """Rewrite ``data.dataset_dir`` and ``data.name`` (default: the folder's name) in ``params_path``; True when
    either changed."""
    changed = set_data_key(params_path, "dataset_dir", dataset_dir)
    return set_data_key(params_path, "name", name or Path(dataset_dir).name) or changed


def set_data_key(params_path: str | Path, key: str, value: str) -> bool:
    """Rewrite the one line ``data.<key>`` in ``params_path`` (comments kept); True when it changed."""
    path = Path(params_path)
    pattern = re.compile(rf"^(?P<indent>[ \t]+){key}:[ \t]*(?P<value>[^#\n]*?)(?P<rest>[ \t]*(#.*)?)$")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    in_data = False
    for i, line in enumerate(lines):
        if _DATA_KEY.match(line.rstrip("\n")):
            in_data = True
            continue
        if in_data and line.strip() and not line[0].isspace():
            break   # left the data section without finding the key
        m = pattern.match(line.rstrip("\n")) if in_data else None
        if m and len(m.group("indent")) <= 2:
            if m.group("value").strip() == value:
                return False
            lines[i] = f"{m.group('indent')}{key}: {value}{m.group('rest')}\n"
            with atomic_file(path) as fh:
                fh.write("".join(lines))
            return True
    raise ConfigError(f"{path}: no data.{key} key to set")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m xmc.config.use_dataset", description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", nargs="?", help="a dataset folder, or the name of one under --root")
    ap.add_argument("--show-name", action="store_true", help="print the current data.name (the outputs' folder "
                    "under results/) and change nothing")
    ap.add_argument("--root", default="../shared/datasets",
                    help="where bare dataset names are looked up (default: ../shared/datasets)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--name", default=None, help="data.name: the outputs' folder results/<name>/ (default: the "
                    "dataset folder's name)")
    args = ap.parse_args(argv)
    if args.show_name:
        try:
            print(results_dir(args.params).name)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        return
    if not args.dataset:
        ap.error("a dataset folder or name is needed (or --show-name)")
    try:
        target = resolve_dataset(args.dataset, args.root)
        changed = set_dataset_dir(args.params, target, args.name)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    name = args.name or Path(target).name
    print(f"{args.params}: data.dataset_dir {'set to' if changed else 'is already'} {target}, data.name {name} "
          f"(outputs: results/{name}/)")


if __name__ == "__main__":
    main()
