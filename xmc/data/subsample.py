"""Deterministic subsampling for tests and quick runs."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xmc.data.dataset import Split, XMCDataset


def _take(split: Split, n: int, unit: str) -> tuple[Split, np.ndarray]:
    if n <= 0:
        return split, np.arange(len(split))
    if unit == "instances" or split.groups is None:
        keep = np.arange(min(n, len(split)))
    elif unit == "documents":
        order: dict[str | None, int] = {}
        for g in split.groups:
            order.setdefault(g, len(order))
        keep = np.array([i for i, g in enumerate(split.groups) if order[g] < n], dtype=np.int64)
    else:
        raise ValueError(f"subsample unit must be 'documents' or 'instances', not {unit!r}")
    return Split(
        uids=[split.uids[i] for i in keep],
        texts=[split.texts[i] for i in keep],
        Y=split.Y[keep],
        groups=[split.groups[i] for i in keep] if split.groups is not None else None,
    ), keep


def subsample_validation(ds: XMCDataset, n_val: int, unit: str = "documents") -> XMCDataset:
    """The first ``n_val`` documents (or instances) of the validation split, the other splits unchanged; 0 keeps
    all. Applied after the split is carved (or read), so the training split is the same with or without the cap:
    at 10^6 instances a 10 % validation split is 10^5 queries to predict against every label, where a sample of
    10^4 bounds each interval to about a point."""
    if ds.val is None or n_val <= 0:
        return ds
    val, keep = _take(ds.val, n_val, unit)
    meta = dict(ds.meta)
    before = meta.get("validation", {})
    meta["validation"] = {**before, "subsample": {"first": n_val, "unit": unit},
                          "instances": len(val), "instances_before_subsample": len(ds.val)}
    if "groups" in before and val.groups is not None:
        meta["validation"].update(groups=len({g for g in val.groups if g is not None}),
                                  groups_before_subsample=before["groups"])
    return XMCDataset(ds.label_uids, ds.label_texts, ds.trn, ds.tst, ds.tst_filter, meta, val=val,
                      val_filter=ds.val_filter[keep].tocsr() if ds.val_filter is not None else None,
                      trn_filter=ds.trn_filter)


def subsample(ds: XMCDataset, n_trn: int = 0, n_tst: int = 0, unit: str = "documents",
              labels: str = "all") -> XMCDataset:
    """The first ``n_trn``/``n_tst`` documents (or instances) of each split; 0 keeps all.

    ``labels='used'`` restricts the label space to labels that occur in the kept
    instances (ids renumbered in their original order), which keeps encoder-based tests
    small; ``'all'`` keeps every label so zero-shot labels stay in play.
    """
    trn, trn_keep = _take(ds.trn, n_trn, unit)
    val, val_keep = _take(ds.val, n_trn, unit) if ds.val is not None else (None, None)  # a shipped validation split
    tst, tst_keep = _take(ds.tst, n_tst, unit)
    filt = ds.tst_filter[tst_keep] if ds.tst_filter is not None else None
    trn_filt = ds.trn_filter[trn_keep] if ds.trn_filter is not None else None
    val_filt = ds.val_filter[val_keep] if ds.val_filter is not None else None
    label_uids, label_texts = ds.label_uids, ds.label_texts
    if labels == "used":
        used = np.flatnonzero(np.asarray((trn.Y.sum(0) + tst.Y.sum(0) + (val.Y.sum(0) if val is not None else 0))).ravel() > 0)
        trn = Split(trn.uids, trn.texts, trn.Y[:, used].tocsr(), trn.groups)
        val = Split(val.uids, val.texts, val.Y[:, used].tocsr(), val.groups) if val is not None else None
        tst = Split(tst.uids, tst.texts, tst.Y[:, used].tocsr(), tst.groups)
        filt = filt[:, used].tocsr() if filt is not None else None
        trn_filt = trn_filt[:, used].tocsr() if trn_filt is not None else None
        val_filt = val_filt[:, used].tocsr() if val_filt is not None else None
        label_uids = [label_uids[i] for i in used]
        label_texts = [label_texts[i] for i in used]
    elif labels != "all":
        raise ValueError(f"subsample labels must be 'all' or 'used', not {labels!r}")
    meta = dict(ds.meta)
    meta["subsample"] = {"trn": n_trn, "tst": n_tst, "unit": unit, "labels": labels}
    return XMCDataset(label_uids, label_texts, trn, tst,
                      sp.csr_matrix(filt) if filt is not None else None, meta, val=val,
                      val_filter=sp.csr_matrix(val_filt) if val_filt is not None else None,
                      trn_filter=sp.csr_matrix(trn_filt) if trn_filt is not None else None)
