"""Model registry over git + DVC: the packages the registry versions and promotes are DVC artifacts
(``artifacts:`` in dvc.yaml), versions and stages are GTO git tags (``astra@v0.1.0``, ``astra#prod#3``), the
files live in the DVC cache / remote. Every package the pipeline builds is in the workspace as
``results/<data.name>/packages/<name>/`` (``package@<run>``, ``fuse@<hybrid>``), artifact or not.

Model specs understood everywhere a model is named (``xmc predict MODEL``, ``xmc.load``, the service,
the batch-prediction flow):

- a folder path: that package;
- ``NAME``: the workspace package ``results/<data.name>/packages/NAME/`` of the dataset params.yaml names (after
  ``make run`` or ``dvc pull`` of it), or the path of artifact NAME when dvc.yaml gives it another one;
- ``NAME#STAGE`` / ``NAME@vX.Y.Z``: the version of artifact NAME with that stage label / that version, fetched
  from the DVC cache or remote into ``$XMC_CACHE_DIR`` (default ``~/.cache/xmc/packages``);
- ``#STAGE`` (e.g. ``#prod``): the artifact that received that stage most recently.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xmc.errors import ConfigError
from xmc.workspace import results_dir

STAGE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?")   # a registry stage (GTO's names, lower-case)

SPEC = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_-]*)?(?:#(?P<stage>[a-z0-9_-]+)|@(?P<version>v\d+\.\d+\.\d+))?$")


def find_repo(start: str | Path | None = None) -> Path | None:
    """The DVC repository holding ``start`` (default: ``$XMC_REPO_DIR`` or the working directory)."""
    p = Path(start or os.environ.get("XMC_REPO_DIR") or ".").resolve()
    for d in (p, *p.parents):
        if (d / "dvc.yaml").is_file() and (d / ".dvc").is_dir():
            return d
    return None


def artifacts(repo: Path) -> dict[str, dict[str, Any]]:
    """``artifacts:`` of the repository's dvc.yaml."""
    import yaml

    try:
        doc = yaml.safe_load((repo / "dvc.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{repo / 'dvc.yaml'}: unreadable ({str(e).splitlines()[0][:120]})") from None
    arts = doc.get("artifacts") or {}
    return {k: v for k, v in arts.items() if isinstance(v, dict) and "path" in v}


def cache_dir() -> Path:
    return Path(os.environ.get("XMC_CACHE_DIR") or Path.home() / ".cache" / "xmc" / "packages")


MANIFEST = "manifest.json"


def _params(root: Path) -> dict[str, Any]:
    import yaml

    try:
        p = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return p if isinstance(p, dict) else {}


def packages_dir(root: Path) -> str:
    """The workspace's packages, relative to the repository: results/<data.name>/packages (the pipeline's package@
    and fuse@ stages write ``<that>/<name>/``), for the dataset params.yaml names."""
    return (results_dir(root / "params.yaml").relative_to(root) / "packages").as_posix()


def _looks_like_path(spec: str) -> bool:
    return os.sep in spec or "/" in spec or spec.startswith(".") or Path(spec).exists()


def workspace_packages(repo: Path) -> list[str]:
    """The names of the packages in the workspace (``results/<data.name>/packages/<name>/`` holding a manifest)."""
    d = repo / packages_dir(repo)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir() and (p / MANIFEST).is_file())


def resolve(spec: str, repo: str | Path | None = None, paths: bool = True) -> Path:
    """The local folder of the package that ``spec`` names (fetching a registered version if needed).
    ``paths=False``: ``spec`` is a registry name only, never a folder (a name that happens to be a folder in the
    working directory is still looked up in the repository)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("no model given (a package folder or a registry name such as astra or astra#prod)")
    spec = spec.strip()
    if paths and _looks_like_path(spec):
        return Path(spec)
    m = SPEC.match(spec)
    if not m or not (m["name"] or m["stage"]):
        raise ConfigError(f"{spec!r}: not a package folder nor a registry name (NAME, NAME#STAGE, NAME@vX.Y.Z, #STAGE)")
    root = find_repo(repo)
    if root is None:
        raise ConfigError(f"{spec!r}: not a folder, and no DVC repository here to look the name up in "
                          "(run inside the project or set XMC_REPO_DIR)")
    arts = artifacts(root)
    name = m["name"]
    if not m["stage"] and not m["version"]:
        return workspace_package(root, name, arts)
    if name is None:
        name = latest_in_stage(root, m["stage"])
    if name not in arts:
        what = f"stage {m['stage']!r}" if m["stage"] else f"version {m['version']}"
        held = f" (its workspace package is {packages_dir(root)}/{name}/)" if name in workspace_packages(root) else ""
        raise ConfigError(f"{spec!r}: {name!r} is not an artifact of {root / 'dvc.yaml'}, so it has no {what}{held}; "
                          f"the registry versions only its artifacts: {', '.join(sorted(arts)) or 'none'}")
    return fetch_version(root, name, stage=m["stage"], version=m["version"])


def workspace_package(root: Path, name: str, arts: dict[str, dict[str, Any]] | None = None) -> Path:
    """``results/<data.name>/packages/<name>/`` when it holds a package, else the path of artifact ``name``; a
    one-line error saying how to get it when neither is there."""
    arts = artifacts(root) if arts is None else arts
    rel = f"{packages_dir(root)}/{name}"
    path = root / rel
    if (path / MANIFEST).is_file():
        return path
    if name in arts:
        rel = str(arts[name]["path"])
        if (root / rel / MANIFEST).is_file():
            return root / rel
    known = _pipeline_packages(root)
    if name in known:
        how = f"`dvc pull {rel}` fetches it from the remote, `dvc repro {known[name]}` builds it"
    elif name in arts:
        how = f"`dvc pull {rel}` fetches it from the remote (this params.yaml builds no {name}: not under runs or hybrids)"
    else:
        have = sorted(set(workspace_packages(root)) | set(arts) | set(known))
        raise ConfigError(f"{name!r}: no package {rel}/ in {root} and no artifact {name!r} in dvc.yaml "
                          f"(have: {', '.join(have) or 'none'}; `xmc registry` lists them)")
    raise ConfigError(f"{root / rel}: package {name!r} is not in the workspace: {how}")


def _pipeline_packages(root: Path) -> dict[str, str]:
    """The packages the repository's pipeline builds (name -> its stage), from params.yaml; {} if unreadable."""
    p = _params(root)
    runs, hybrids = p.get("runs") or {}, p.get("hybrids") or {}
    if not isinstance(runs, dict) or not isinstance(hybrids, dict):
        return {}
    return {**{r: f"package@{r}" for r in runs}, **{h: f"fuse@{h}" for h in hybrids}}


def _rev_of(root: Path, name: str, stage: str | None, version: str | None) -> str:
    from dvc.exceptions import ArtifactNotFoundError
    from dvc.repo import Repo

    with Repo(str(root)) as r:
        try:
            return r.artifacts.get_rev(name, version=version, stage=stage)
        except ArtifactNotFoundError:
            what = f"stage {stage!r}" if stage else f"version {version}"
            raise ConfigError(f"artifact {name!r} has no {what} in {root} (see `xmc registry`)") from None


def fetch_version(root: Path, name: str, stage: str | None = None, version: str | None = None) -> Path:
    """Download a registered version of ``name`` (from the DVC cache or remote) into the package cache."""
    from dvc.repo import Repo

    rev = _rev_of(root, name, stage, version)
    dest = cache_dir() / name / rev
    if (dest / "manifest.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{rev}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with Repo(str(root)) as r:
            r.artifacts.download(name, version=version, stage=stage, out=str(tmp), force=True)
        os.replace(tmp, dest)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - DVC raises many kinds; the user needs one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"could not fetch {name} ({stage or version}, commit {rev[:12]}): {first} "
                          "(is the DVC remote reachable? `dvc remote list`)") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ------------------------------------------------------------------------------------------------
# stages and promotion
# ------------------------------------------------------------------------------------------------
def stage_assignments(root: Path, stage: str) -> list[tuple[str, str, Any]]:
    """(artifact, version, assignment time) of every artifact currently holding ``stage``, newest first."""
    from gto.api import find_versions_in_stage

    out = []
    for name in artifacts(root):
        try:
            found = find_versions_in_stage(str(root), name, stage)
        except Exception:  # noqa: BLE001 - no tags for this artifact
            continue
        for v in found if isinstance(found, list) else [found]:
            if v is None:
                continue
            out.append((name, v.version, getattr(v, "activated_at", None) or v.created_at))
    return sorted(out, key=lambda t: t[2], reverse=True)


def latest_in_stage(root: Path, stage: str) -> str:
    found = stage_assignments(root, stage)
    if not found:
        raise ConfigError(f"no model holds stage {stage!r} in {root} (promote one: `xmc promote NAME --stage {stage}`)")
    return found[0][0]


@dataclass
class GateDecision:
    """Whether a candidate package may take a stage from the current holder, and why."""

    promote: bool
    reasons: list[str] = field(default_factory=list)
    compared: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"promote": self.promote, "reasons": self.reasons, "compared": self.compared}


def gate(candidate: dict[str, Any], current: dict[str, Any] | None, cfg: dict[str, Any]) -> GateDecision:
    """Compare two manifests' **validation** metrics: promote when no gated metric falls more than its
    margin (points) below the current holder's, on the same dataset."""
    from xmc.config.schema import GateConfig, filled

    cfg = filled(GateConfig, cfg, "registry.gate")
    margins: dict[str, float] = {k: float(v) for k, v in cfg["max_drop"].items()}
    cand = ((candidate.get("metrics") or {}).get("val")) or {}
    missing = [k for k in margins if not isinstance(cand.get(k), (int, float))]
    if missing:
        return GateDecision(False, [f"the candidate has no validation {', '.join(missing)} in its manifest"])
    if current is None:
        return GateDecision(True, ["no current holder: the first version takes the stage"],
                            {k: {"candidate": cand[k], "current": None} for k in margins})
    cur = ((current.get("metrics") or {}).get("val")) or {}
    reasons: list[str] = []
    ok = True
    if candidate.get("labels", {}).get("sha256") != current.get("labels", {}).get("sha256") and \
            not cfg["allow_label_set_change"]:
        return GateDecision(False, ["the label set differs from the current holder's: validation metrics are not "
                                    "comparable (registry.gate.allow_label_set_change)"])
    if (candidate.get("dataset") or {}).get("sha256") != (current.get("dataset") or {}).get("sha256"):
        if not cfg["allow_dataset_change"]:
            return GateDecision(False, ["trained and validated on different data than the current holder "
                                        "(registry.gate.allow_dataset_change)"])
        reasons.append("different data than the current holder (allowed by registry.gate.allow_dataset_change)")
    compared = {}
    for k, margin in margins.items():
        c, p = float(cand[k]), cur.get(k)
        compared[k] = {"candidate": c, "current": p, "max_drop": margin}
        if isinstance(p, (int, float)) and c < float(p) - margin:
            ok = False
            reasons.append(f"validation {k} {c:.2f} is more than {margin:g} below the current {float(p):.2f}")
        elif isinstance(p, (int, float)):
            reasons.append(f"validation {k} {c:.2f} vs current {float(p):.2f} (may fall at most {margin:g})")
    return GateDecision(ok, reasons, compared)


def current_manifest(root: Path, name: str, stage: str) -> tuple[str | None, dict[str, Any] | None]:
    """(version, manifest) of the version of ``name`` holding ``stage``, or (None, None)."""
    import json

    import dvc.api

    held = [(n, v) for n, v, _ in stage_assignments(root, stage) if n == name]
    if not held:
        return None, None
    version = held[0][1]
    rev = _rev_of(root, name, None, version)
    path = artifacts(root)[name]["path"]
    try:
        text = dvc.api.read(f"{path}/manifest.json", repo=str(root), rev=rev, encoding="utf-8")
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"could not read {name} {version}'s manifest at {rev[:12]}: {str(e).splitlines()[0][:160]}") from None
    return version, json.loads(text)


def promote(root: Path, name: str, stage: str, gate_cfg: dict[str, Any], force: bool = False,
            message: str | None = None) -> dict[str, Any]:
    """Register the committed package of ``name`` at HEAD as a new version and give it ``stage`` if the
    gate allows (``force`` skips the gate). The package must be committed (dvc.lock) and its files pushed."""
    import json

    from gto.api import assign, register

    from xmc.package.package import read_manifest

    if not isinstance(stage, str) or not STAGE_NAME.fullmatch(stage):
        raise ConfigError(f"--stage {stage!r}: a stage is lower-case letters, digits, '-' or '_', starting and "
                          "ending with a letter or digit (dev, staging, prod)")
    arts = artifacts(root)
    if name not in arts:
        raise ConfigError(f"no artifact {name!r} in {root / 'dvc.yaml'}: the registry versions and promotes only "
                          f"the packages listed under its artifacts: ({', '.join(sorted(arts)) or 'none'}); "
                          f"add {name} there to version it")
    check_artifact_dataset(root, name, arts[name]["path"])
    cand = read_manifest(root / arts[name]["path"])
    version, cur = current_manifest(root, name, stage)
    decision = gate(cand, cur, gate_cfg)
    result: dict[str, Any] = {"artifact": name, "stage": stage, "current_version": version, **decision.to_dict()}
    if not decision.promote and not force:
        result["assigned"] = None
        return result
    note = message or f"{name}: validation {json.dumps({k: cand.get('metrics', {}).get('val', {}).get(k) for k in gate_cfg.get('max_drop', {})})}"
    new_version, created = _register_head(root, name, note, register)
    try:
        assign(str(root), name, stage, version=new_version, message=message or f"promote {name} to {stage}",
               force=True)
    except Exception as e:  # noqa: BLE001 - a promote that fails leaves no version behind it registered
        if created:
            _git(root, "tag", "-d", f"{name}@{new_version}")
        raise ConfigError(f"could not give {name} {new_version} the stage {stage!r}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
                          + ("; the version registered for it was removed" if created else "")) from None
    result["assigned"] = new_version
    return result


def check_artifact_dataset(root: Path, name: str, path: str) -> None:
    """An artifact that is a dataset's package (``results/<dataset>/packages/...``) is promoted only from a checkout
    whose params.yaml names that dataset: a run on another dataset never versions, or stages, this one's models."""
    parts = Path(path).parts
    if len(parts) < 3 or parts[0] != "results" or parts[2] != "packages":
        return   # an artifact kept elsewhere: not namespaced by dataset
    here = results_dir(root / "params.yaml").name
    if parts[1] != here:
        raise ConfigError(f"artifact {name!r} is the package of dataset {parts[1]!r} ({path}) but params.yaml's "
                          f"data.name is {here!r}: promote it from a checkout of {parts[1]}, or declare an artifact "
                          f"for {here}'s package in dvc.yaml (e.g. {name}-{here}: {{path: "
                          f"results/{here}/packages/{name}, type: model}})")


def _register_head(root: Path, name: str, message: str, register: Any) -> tuple[str, bool]:
    """The version of ``name`` at HEAD, and whether it was registered now (v0.1.0 first, then the next minor)
    rather than already."""
    from gto.api import show

    def versions() -> list[dict[str, Any]]:
        try:
            out = show(str(root), name, table=False)
            return out[0] if isinstance(out, tuple) else out
        except Exception:  # noqa: BLE001 - nothing registered yet
            return []

    head = _git(root, "rev-parse", "HEAD")
    for v in versions():
        if str(v.get("commit_hexsha", "")) == head and v.get("registrations"):
            return str(v["version"]), False
    try:
        first = not any(v.get("version") for v in versions())
        tag = register(str(root), name, ref="HEAD", message=message,
                       **({"version": "v0.1.0"} if first else {"bump_minor": True}))
    except Exception as e:  # noqa: BLE001 - GTO's errors are one line enough
        raise ConfigError(f"could not register {name} at HEAD: {str(e).splitlines()[0][:200]}") from None
    version = getattr(tag, "version", None) or getattr(getattr(tag, "tag", None), "version", None)
    if version is None:
        raise ConfigError(f"GTO registered {name} but returned no version ({tag!r})")
    return str(version), True


def _git(root: Path, *args: str) -> str:
    import subprocess

    p = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} failed in {root}: {p.stderr.strip()[:200]}")
    return p.stdout.strip()


def listing(root: Path, name: str | None = None) -> list[dict[str, Any]]:
    """``xmc registry``: every package of the repository (its artifacts, the packages in the workspace and those
    its pipeline builds), or just ``name``, with its latest version and stage labels (artifacts only) and whether
    it is in the workspace."""
    arts = artifacts(root)
    ws = set(workspace_packages(root))
    built = _pipeline_packages(root)
    known = set(arts) | ws | set(built)
    if name is not None and name not in known:
        raise ConfigError(f"{name!r}: no artifact of that name in {root / 'dvc.yaml'} and no package "
                          f"{packages_dir(root)}/{name}/ (have: {', '.join(sorted(known)) or 'none'})")
    table: dict[str, Any] = {}
    if arts:
        from gto.api import show

        try:
            shown = show(str(root), table=False)
            table = shown if isinstance(shown, dict) else {}
        except Exception:  # noqa: BLE001 - no tags yet
            table = {}
    rows = []
    for n in [name] if name else sorted(known):
        r = table.get(n) or {}
        stages = r.get("stage") or {}
        path = f"{packages_dir(root)}/{n}" if n not in arts or n in ws else str(arts[n]["path"])
        rows.append({"name": n, "artifact": n in arts, "latest": r.get("version"), "stages": dict(stages),
                     "path": path, "workspace": (root / path / MANIFEST).is_file(), "stage": built.get(n)})
    return rows


def format_listing(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`listing` as the table ``xmc registry`` prints."""
    lines = [f"{'package':<28} {'artifact':<9} {'latest':<10} {'dev':<10} {'prod':<10} workspace"]
    for r in rows:
        if r["workspace"]:
            ws = f"yes ({r['path']})"
        else:
            ws = f"no (dvc pull {r['path']}" + (f", or dvc repro {r['stage']})" if r["stage"] else ")")
        lines.append(f"{r['name']:<28} {'yes' if r['artifact'] else 'no':<9} {r['latest'] or '-':<10} "
                     f"{r['stages'].get('dev') or '-':<10} {r['stages'].get('prod') or '-':<10} {ws}")
    return "\n".join(lines)


def load_model(spec: str, **kwargs: Any) -> Any:
    """``xmc.load``: resolve ``spec`` (see module doc) and load the package."""
    from xmc.package.package import load

    repo = kwargs.pop("repo", None)
    return load(resolve(spec, repo), **kwargs)


__all__ = ["GateDecision", "artifacts", "cache_dir", "current_manifest", "fetch_version", "find_repo", "format_listing",
           "gate", "latest_in_stage", "listing", "load_model", "promote", "resolve", "stage_assignments",
           "packages_dir", "workspace_package", "workspace_packages"]
