"""The ``xmc`` command: train a model on a dataset folder; predict with, inspect, serve, list and promote packages.

    xmc train DATA_DIR [--method astra] [--config my.yaml] [--set train.epochs=8] [--out models/astra]
    xmc predict MODEL [-k 10] [--input FILE|-] [--output FILE|-] [--format jsonl|tsv]
    xmc info MODEL [--verify] [--json]
    xmc serve MODEL [--host 127.0.0.1] [--port 8000]
    xmc registry [NAME]
    xmc promote NAME [--stage prod] [--force]

MODEL is a package folder or a registry name (``astra``, ``astra#prod``, ``astra@v0.2.0``, ``#prod``).
Errors are one line on stderr (exit 2: bad input or model, 3: resources, 1: other).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from xmc.errors import ConfigError

# Each command imports what it needs when it runs (the package loader and torch, the training code, FastAPI, the
# registry), so that `xmc --help` and a mistyped argument answer in a fraction of a second.


def _serve_defaults() -> dict[str, Any]:
    """``serve`` of the project's params.yaml when run inside the project, else the schema defaults."""
    from xmc.config.schema import ServeConfig
    from xmc.package.registry import find_repo

    out = ServeConfig().model_dump()
    repo = find_repo()
    if repo is not None and (repo / "params.yaml").is_file():
        try:
            from xmc.config import load_params

            out.update(load_params(repo / "params.yaml")["serve"])
        except Exception:  # noqa: BLE001 - a broken params file must not stop serving a package folder
            pass
    return out


def _set_override(text: str) -> dict[str, Any]:
    """``key.path=value`` (the value read as YAML: numbers, booleans, lists) -> a nested override."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise ConfigError(f"--set {text!r}: expected key.path=value (e.g. train.epochs=8)")
    try:
        parsed = yaml.safe_load(value) if value.strip() else value
    except yaml.YAMLError:
        parsed = value
    out: dict[str, Any] = {}
    node = out
    *parents, last = key.strip().split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = parsed
    return out


def cmd_train(a: argparse.Namespace) -> None:
    from xmc.config.schema import deep_merge
    from xmc.config.training import resolve_training

    overrides: dict[str, Any] = {}
    for item in a.set or []:
        overrides = deep_merge(overrides, _set_override(item))
    # the folder, the overrides, the method and --out are checked before the training code (torch, scikit-learn)
    # is imported: a typo is one line in a second
    req = resolve_training(a.data_dir, a.method, a.out, a.config, **overrides)
    from xmc.api import train_resolved

    pkg = train_resolved(req, work_dir=a.work_dir, keep_work=a.work_dir is not None, run_validation=not a.no_validate)
    metrics = pkg.manifest.get("metrics") or {}
    print(f"trained {pkg.method} on {a.data_dir} -> {pkg.root} ({pkg.n_labels} labels)", file=sys.stderr)
    for split, label in (("val", "validation"), ("tst", "test")):
        if metrics.get(split):
            print(f"  {label:<10}  {_short_metrics(metrics[split])}", file=sys.stderr)


TSV_HEADER = "id\trank\tlabel_id\tlabel_index\tscore\tlabel_text\n"


def _write_tsv(out: TextIO, uid: str, preds: list[Any]) -> None:
    for rank, p in enumerate(preds, 1):
        text = p.text.replace("\t", " ").replace("\n", " ")
        out.write(f"{uid}\t{rank}\t{p.id}\t{p.index}\t{p.score:.6f}\t{text}\n")


def _tracked_outputs(start: Path) -> list[Path]:
    """The outputs the enclosing DVC project records (dvc.lock: every stage's outs), resolved: a prediction written
    over one of them would silently replace another stage's result."""
    from xmc.package.registry import find_repo
    from xmc.yaml12 import fast_yaml_loader

    repo = find_repo(start)
    found: list[Path] = []
    for lock in ([repo / "dvc.lock", repo / "lab" / "dvc.lock"] if repo is not None else []):
        try:
            stages = (yaml.load(lock.read_text(), Loader=fast_yaml_loader()) or {}).get("stages") or {}
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        base = lock.parent
        for st in stages.values() if isinstance(stages, dict) else ():
            for out in (st or {}).get("outs") or []:
                if isinstance(out, dict) and isinstance(out.get("path"), str):
                    found.append((base / out["path"]).resolve())
    return found


def _check_output(output: str, others: dict[str, str | Path | None]) -> Path:
    """Where ``--output`` is written: symbolic links followed to their target. Refused (nothing written) when it
    would replace an input of the same command or an output another stage of the project recorded."""
    out_p = Path(output).resolve()
    for what, p in others.items():
        if p is None or str(p) == "-" or (what == "expected labels" and not Path(str(p)).exists()):
            continue
        q = Path(p).resolve()
        if out_p == q or q in out_p.parents:
            raise ConfigError(f"{output}: the output would overwrite the {what} {p}")
    for q in _tracked_outputs(out_p.parent if out_p.parent.exists() else Path.cwd()):
        if out_p == q or q in out_p.parents:
            raise ConfigError(f"{output}: the output would overwrite {q}, an output of the project's pipeline "
                              "(dvc.lock); write predictions elsewhere")
    return out_p


def _writes_through(path: Path) -> bool:
    """A device, a FIFO or a socket (``/dev/null``, ``/dev/stdout``, a named pipe) is written in place: an atomic
    rename would replace it with a regular file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def cmd_predict(a: argparse.Namespace) -> None:
    from xmc.io import atomic_file
    from xmc.package import check_k, load
    from xmc.package.inputs import iter_input
    from xmc.package.registry import resolve

    k = check_k(a.k)
    if a.batch_size < 1 or a.batch_size > 65536:
        raise ConfigError(f"--batch-size must be in [1, 65536] (got {a.batch_size})")
    path = resolve(a.model)
    out_p = None if a.output == "-" else _check_output(a.output, {"input": a.input, "model": path,
                                                                  "expected labels": a.expect_labels})
    if a.input != "-":
        for _ in iter_input(a.input, a.input_format):  # a bad line fails before any output is written
            pass
    pkg = load(path, expect_labels=a.expect_labels)
    n = 0

    def write(out: TextIO) -> int:
        count = 0
        if a.format == "tsv":
            out.write(TSV_HEADER)
        for uid, text, preds in pkg.predict_stream(iter_input(a.input, a.input_format), k, a.batch_size):
            if a.format == "tsv":
                _write_tsv(out, uid, preds)
            else:
                out.write(json.dumps({"id": uid, "text": text, "labels": [p.to_dict() for p in preds]},
                                     ensure_ascii=False) + "\n")
            count += 1
        return count

    if out_p is None:
        n = write(sys.stdout)
        sys.stdout.flush()
    elif _writes_through(out_p):
        with open(out_p, "w", encoding="utf-8") as fh:
            n = write(fh)
    else:
        with atomic_file(out_p) as fh:
            n = write(fh)
    print(f"top-{k} labels of {n} texts from {pkg.name} ({pkg.method}, {pkg.n_labels} labels)"
          + ("" if a.output == "-" else f" -> {a.output}"), file=sys.stderr)


def _short_metrics(m: dict[str, Any]) -> str:
    keys = ("P@1", "P@5", "PSP@5", "R@100")
    return "  ".join(f"{k} {m[k]:.2f}" for k in keys if isinstance(m.get(k), (int, float))) or "-"


def cmd_info(a: argparse.Namespace) -> None:
    from xmc.package import load, read_manifest
    from xmc.package.package import score_meaning
    from xmc.package.registry import resolve

    path = resolve(a.model)
    if a.verify:
        load(path, verify=True)  # every file's SHA-256, the labels, the predictor
    m = read_manifest(path)
    if a.json:
        print(json.dumps({**{k: v for k, v in m.items() if k != "files" or a.verify},
                          "score": score_meaning(m["predictor"])}, indent=2, ensure_ascii=False))
        return
    size = sum(int(f.get("bytes", 0)) for f in m["files"].values())
    pred = m["predictor"]
    print(f"{m['name']}: {m['method']} ({pred.get('kind')}{', space ' + pred['space'] if pred.get('space') else ''})")
    print(f"  path        {path}  ({size / 1e6:.1f} MB, {len(m['files'])} files{', verified' if a.verify else ''})")
    print(f"  labels      {m['labels']['count']}  (label-set sha256 {m['labels']['sha256'][:16]})")
    ds = m.get("dataset") or {}
    print(f"  data        {ds.get('source', '?')}  (sha256 {str(ds.get('sha256', '?'))[:16]}, "
          f"{ds.get('train_instances', '?')} training instances)")
    print(f"  code        {json.dumps(m.get('code', {}))}")
    metrics = m.get("metrics") or {}
    print(f"  validation  {_short_metrics(metrics.get('val') or {})}")
    print(f"  test        {_short_metrics(metrics.get('tst') or {})}")
    print(f"  score       {score_meaning(pred)}")


def cmd_serve(a: argparse.Namespace) -> None:
    from xmc.serve import serve

    d = _serve_defaults()
    serve(a.model or d.get("model") or "#prod", host=a.host or d["host"],
          port=a.port if a.port is not None else d["port"],
          limits={k: d[k] for k in ("max_texts", "max_chars", "max_k", "batch_size")}, token_env=a.token_env,
          expect_labels=a.expect_labels,
          idle_timeout_s=a.idle_timeout if a.idle_timeout is not None else d["idle_timeout_s"],
          max_connections=a.max_connections if a.max_connections is not None else d["max_connections"])


def cmd_registry(a: argparse.Namespace) -> None:
    from xmc.package.registry import find_repo, format_listing, listing

    repo = find_repo()
    if repo is None:
        raise ConfigError("no DVC repository here (run inside the project or set XMC_REPO_DIR)")
    print(format_listing(listing(repo, a.name)))


def cmd_promote(a: argparse.Namespace) -> None:
    from xmc.config import load_params
    from xmc.package.registry import find_repo, promote

    repo = find_repo()
    if repo is None:
        raise ConfigError("no DVC repository here (run inside the project or set XMC_REPO_DIR)")
    reg = load_params(repo / "params.yaml")["registry"]
    res = promote(repo, a.name, a.stage if a.stage is not None else reg["stage"], reg["gate"], force=a.force)
    print(json.dumps(res, indent=2))
    if not res["promote"] and not a.force:
        sys.exit(4)


def _methods_help() -> str:
    """The methods and their main knobs, from the defaults files (``xmc train --help``)."""
    from xmc.config.runs import DESCRIPTIONS, PAPER_METHODS, main_knobs

    lines = ["methods (--method) and their main knobs (--set key=value, or a --config YAML of the same keys):", ""]
    for m in (*PAPER_METHODS, *[m for m in DESCRIPTIONS if m not in PAPER_METHODS]):
        lines.append(f"  {m:<15} {DESCRIPTIONS[m]}")
        knobs = [k for k, _ in main_knobs(m)]
        if knobs:
            shown = ", ".join(knobs[:12]) + (", ..." if len(knobs) > 12 else "")
            lines.append(f"  {'':<15} {shown}")
    lines += ["", "Every knob with its default and meaning: xmc/config/defaults/<method>.yaml. Product sections (data, "
              "evaluate, index, label_names, tfidf, graph, maclr_pairs) are set the same way, e.g. "
              "--set data.validation.fraction=0.2."]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="xmc", description="Train xmc models on a dataset folder; predict with, inspect, "
                                 "serve and promote model packages. MODEL is a package folder or a registry name "
                                 "(astra, astra#prod, astra@v0.2.0, #prod).")
    ap.add_argument("--debug", action="store_true", help="full tracebacks instead of one-line errors")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train one method on a dataset folder and write its model package",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Read DATA_DIR (XC raw: trn.raw.txt + trn_X_Y.txt + lbl.raw.txt, optional tst/val "
                       "files; or JSON lines: trn.json + lbl.json), carve a validation split from training where none "
                       "is shipped, validate the data, train METHOD with its defaults and your overrides, evaluate "
                       "on validation (and test when there is one) and write a model package that `xmc predict` and "
                       "`xmc serve` load. No DVC or git needed.", epilog=_methods_help())
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--method", default="astra", metavar="METHOD", help="the method to train (default astra; below)")
    p.add_argument("--config", metavar="YAML", help="a YAML file of overrides (the method's knobs; product sections "
                   "by name)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="one override, e.g. train.epochs=8 "
                   "(repeatable; applied after --config)")
    p.add_argument("--out", metavar="DIR", help="the package folder to write (default models/METHOD)")
    p.add_argument("--work-dir", metavar="DIR", help="keep the processed data, features and checkpoints here "
                   "(a rerun with the same folder resumes); default: a scratch folder, removed at the end")
    p.add_argument("--no-validate", action="store_true", help="skip the great-expectations data checks")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("predict", help="top-k labels for texts (one per line, or JSON lines {id?, text})",
                       description="Top-k labels for a file or stdin of texts: .txt one text per line, .jsonl "
                       "{\"id\"?, \"text\"} per line; streamed in batches (bounded memory).")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-k", type=int, default=10, help="labels per text (1..10000; default 10)")
    p.add_argument("--input", default="-", help="input file, or - for stdin (default)")
    p.add_argument("--input-format", default="auto", choices=("auto", "txt", "jsonl"),
                   help="auto: .jsonl files are JSON lines, anything else one text per line")
    p.add_argument("--output", default="-", help="output file (written atomically), or - for stdout (default)")
    p.add_argument("--format", default="jsonl", choices=("jsonl", "tsv"),
                   help="jsonl: {id, text, labels: [{id, index, text, score}]}; tsv: a header line, then id, "
                        "rank, label_id, label_index, score, label_text (id: the input's, or its line number; "
                        "label_id: the dataset's id of the label, label_index: its row in the package)")
    p.add_argument("--batch-size", type=int, default=256, help="texts encoded at a time")
    p.add_argument("--expect-labels", metavar="FILE|SHA256",
                   help="refuse a package built for another label set (a labels JSON-lines file or its hash)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("info", help="what a package is: method, labels, data, code, metrics",
                       description="Print a package's manifest summary.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--verify", action="store_true", help="also check every file's SHA-256 and load the model")
    p.add_argument("--json", action="store_true", help="the manifest as JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("serve", help="HTTP service: POST /predict, GET /health, GET /model",
                       description="Serve a package over HTTP (FastAPI + uvicorn). Loopback by default; any other "
                       "host requires a bearer token in the environment variable named by --token-env.")
    p.add_argument("model", metavar="MODEL", nargs="?", help="default: params registry.serve (#prod)")
    p.add_argument("--host", default=None, help="default 127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default 8000; 0: a free port (logged)")
    p.add_argument("--token-env", default="XMC_SERVE_TOKEN", help="environment variable holding the bearer token")
    p.add_argument("--expect-labels", metavar="FILE|SHA256",
                   help="refuse to start with a package built for another label set")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="close a connection that sends nothing this long (default: params serve.idle_timeout_s, 5)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections at most; one more is closed when accepted (default 1000)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("registry", help="artifacts, their latest versions and stage labels",
                       description="List the packages of dvc.yaml's artifacts with their GTO versions and stages.")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=cmd_registry)

    p = sub.add_parser("promote", help="gate a package on validation metrics and give it a stage",
                       description="Register the committed package NAME at HEAD and assign it STAGE if its validation "
                       "metrics do not fall below the current holder's by more than params registry.gate.max_drop. "
                       "Exit 4 when the gate refuses.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--stage", default=None, help="default: params registry.stage (prod)")
    p.add_argument("--force", action="store_true", help="assign even if the gate refuses")
    p.set_defaults(func=cmd_promote)
    return ap


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: no per-batch bars in predictions
    from xmc.config import run_entry_point

    args = build_parser().parse_args(argv)
    if args.debug:
        os.environ["XMC_DEBUG"] = "1"
    run_entry_point(lambda: args.func(args))


if __name__ == "__main__":
    main()
