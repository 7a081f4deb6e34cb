"""The pipeline's first stage: results/<data.name>/dataset.json records which dataset the folder's outputs are of;
a run of another dataset under the same name stops here, before any output is removed or rewritten
(xmc.features.ingest.claim_results)."""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.ingest import claim_results
from xmc.workspace import product_workspace


def main() -> None:
    params = load_params()
    claim_results(params["data"], product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main)
