"""Graph metadata for RAMEN: the anchor-set file format, builders, random walk with restart, pruning."""

from xmc.graph.format import AnchorSet, discover_sets, load_anchor_set, load_graph_dir, save_anchor_set
from xmc.graph.rwr import augment_edges, bipartite_adjacency, prune_edges, random_walk_with_restart, rwr_closed_form

__all__ = ["AnchorSet", "augment_edges", "bipartite_adjacency", "discover_sets", "load_anchor_set", "load_graph_dir",
           "prune_edges", "random_walk_with_restart", "rwr_closed_form", "save_anchor_set"]
