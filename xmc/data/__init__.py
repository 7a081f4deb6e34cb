"""Dataset formats and the canonical processed form."""

from xmc.data.dataset import Split, XMCDataset, load_processed, save_processed
from xmc.data.formats import detect_layout, load_dataset_dir
from xmc.data.subsample import subsample

__all__ = [
    "Split",
    "XMCDataset",
    "detect_layout",
    "load_dataset_dir",
    "load_processed",
    "save_processed",
    "subsample",
]
