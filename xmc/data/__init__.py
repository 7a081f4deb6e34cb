"""Dataset formats and the canonical processed form."""

from xmc.data.dataset import SPLIT_FILES, SPLITS, Split, XMCDataset, load_processed, save_processed, split_validation
from xmc.data.formats import detect_layout, load_dataset_dir
from xmc.data.subsample import subsample, subsample_validation

__all__ = [
    "SPLITS",
    "SPLIT_FILES",
    "split_validation",
    "Split",
    "XMCDataset",
    "detect_layout",
    "load_dataset_dir",
    "load_processed",
    "save_processed",
    "subsample",
    "subsample_validation",
]
