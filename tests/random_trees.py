"""Random draft trees for the tests: a batch of trees in the layout ``verify_tree`` takes."""

from __future__ import annotations

from typing import Any

import numpy as np


def random_forest(rng: np.random.Generator, most: int) -> tuple[int, Any, Any, int]:
    """A batch of 1 to 3 random trees of fewer than ``most`` nodes each: the batch size,
    the node counts, the parents (BFS order, concatenated) and the node total."""
    batch = int(rng.integers(1, 4))
    sizes = rng.integers(0, most, batch)
    parents = np.concatenate([
        [int(rng.integers(-1, j)) for j in range(int(n))] for n in sizes
    ] + [[]]).astype(np.int64)
    return batch, sizes, parents, int(sizes.sum())
