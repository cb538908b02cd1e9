"""Graphs as the sparse ops take them: PyG's ``edge_index`` turned into CSR.

A graph neural network layer that aggregates messages from each node's sources is a product of the CSR
matrix whose row i lists node i's incoming edges (row = target, column = source): ``spmm_reduce`` over that
structure sums (or averages, maxes, mins) ``x[source]`` into each target, ``sddmm`` scores every edge from its
two ends, and ``csr_softmax`` normalises the scores over each target's incoming edges.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["to_csr"]


def to_csr(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(crow_indices, col_indices, perm)`` of the ``num_nodes x num_nodes`` CSR matrix of a graph's edges.

    Args:
        edge_index: ``(2, E)`` integer tensor, PyG's convention: ``edge_index[0]`` the source of each edge,
            ``edge_index[1]`` its target. Every index in ``[0, num_nodes)``.
        num_nodes: the number of nodes (rows and columns), at least 0.

    Returns:
        ``crow_indices`` (``num_nodes + 1``) and ``col_indices`` (``E``) of edge_index's dtype and device, row i
        holding the sources of node i's incoming edges, columns ascending within a row (duplicate edges stay,
        each a nonzero, in their order in edge_index); and ``perm`` (``E``, int64): the CSR position p holds
        edge ``perm[p]``, so ``edge_attr[perm]`` lists per-edge values in CSR order. Messages then flow from
        source to target as in PyG: ``spmm_reduce(crow, col, edge_weight[perm], x)[i]`` aggregates over the
        edges into node i.

    Reads the indices to check them (a synchronisation on CUDA): preprocessing, done once per graph.
    """
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = list(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index).__name__
        raise RuntimeError(f"torchops.graph.to_csr: edge_index must be a (2, E) tensor, got {shape}")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
        raise RuntimeError(f"torchops.graph.to_csr: edge_index must hold integers, got {edge_index.dtype}")
    num_nodes = int(num_nodes)
    if num_nodes < 0:
        raise RuntimeError(f"torchops.graph.to_csr: num_nodes must be non-negative, got {num_nodes}")
    source, target = edge_index[0].long(), edge_index[1].long()
    if edge_index.size(1):
        low, high = torch.stack(torch.aminmax(edge_index)).tolist()  # one pass, one sync
        if low < 0 or high >= num_nodes:
            bad = low if low < 0 else high
            raise RuntimeError(f"torchops.graph.to_csr: edge_index must lie in [0, num_nodes) with num_nodes = "
                               f"{num_nodes}, got {bad}")
    # Sort by (target, source); stable, so duplicate edges keep their order.
    perm = torch.sort(target * max(num_nodes, 1) + source, stable=True).indices
    counts = torch.bincount(target, minlength=num_nodes)
    crow = torch.zeros(num_nodes + 1, dtype=torch.int64, device=edge_index.device)
    crow[1:] = torch.cumsum(counts, 0)
    return crow.to(edge_index.dtype), edge_index[0][perm], perm
