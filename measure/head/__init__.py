"""The pruned vocabulary head of the draft and what measures it.

* :mod:`measure.head.pruned_head` — the head (dense, clustered, low-rank, frequency variants);
* :mod:`measure.head.clusters` — offline spherical k-means token clusters (cached on disk);
* :mod:`measure.head.lowrank` — the data-aware low-rank token scorer;
* :mod:`measure.head.triton_head` — the Triton gather-project kernels (torch fallback elsewhere);
* :mod:`measure.head.profiling` — the profiler split of a decoding step by component
  (``python -m measure.head.profiling``);
* :mod:`measure.head.head_sweep` — the head-K sweep (``python -m measure head-sweep``);
* :mod:`measure.head.head_recall` — top-k recall of the selectors (``python -m measure head-recall``);
* :mod:`measure.head.cli` — the command lines of those two.

Nothing here is imported by the sweep unless a cell asks for a pruned head.
"""
