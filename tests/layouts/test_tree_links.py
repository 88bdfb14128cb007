"""specdec_np._layouts.tree_links: the child lists the tree kernels walk, against an obvious
construction, and the CPU driver's check of links it is handed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np import _core, registry
from specdec_np._layouts import tree_links as _tree_links


@st.composite
def layouts(draw: Any, max_batch: int = 5, max_nodes: int = 40) -> tuple:
    """Offsets, parents and tokens of a random batch: empty requests, stars, chains and
    random trees, with tokens from a few values (repeated siblings) or many."""
    batch = draw(st.integers(0, max_batch))
    counts, parents = [], []
    for _ in range(batch):
        count = draw(st.integers(0, max_nodes))
        shape = draw(st.sampled_from(["random", "star", "chain", "wide"]))
        for j in range(count):
            if shape == "star" or j == 0:
                parents.append(-1)
            elif shape == "chain":
                parents.append(j - 1)
            elif shape == "wide":
                parents.append(draw(st.integers(-1, min(j - 1, 2))))
            else:
                parents.append(draw(st.integers(-1, j - 1)))
        counts.append(count)
    total = len(parents)
    values = draw(st.sampled_from([1, 2, 3, 1000]))
    tokens = draw(st.lists(st.integers(0, values - 1), min_size=total, max_size=total))
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    return offsets, np.array(parents, np.int64), np.array(tokens, dtype)


def obvious_links(offsets: np.ndarray, parents: np.ndarray, tokens: np.ndarray) -> tuple:
    """The links by their definition: each node's children listed by a scan of its request."""
    batch, total = offsets.shape[0] - 1, parents.shape[0]
    first_child = np.full(total + batch, -1)
    next_sibling = np.full(total, -1)
    next_distinct = np.full(total, -1)
    repeated = np.zeros(total, np.int8)
    for b in range(batch):
        start, count = int(offsets[b]), int(offsets[b + 1] - offsets[b])
        for node in range(-1, count):
            children = [j for j in range(count) if parents[start + j] == node]
            if children:
                first_child[start + b + node + 1] = children[0]
            distinct = []
            for position, child in enumerate(children):
                if position + 1 < len(children):
                    next_sibling[start + child] = children[position + 1]
                earlier = {int(tokens[start + c]) for c in children[:position]}
                if int(tokens[start + child]) in earlier:
                    repeated[start + child] = 1
                else:
                    distinct.append(child)
            for earlier, later in zip(distinct[:-1], distinct[1:]):
                next_distinct[start + earlier] = later
    return first_child, next_sibling, next_distinct, repeated


def _check_links_by_definition(layout: tuple) -> None:
    offsets, parents, tokens = layout
    expected = obvious_links(*layout)
    sorted_links = _tree_links._sorted_links(offsets, parents, tokens.astype(np.int64))
    links = _tree_links.tree_links(*layout)
    for name, found, by_sorts, wanted in zip(links._fields, links, sorted_links, expected):
        np.testing.assert_array_equal(found, wanted, err_msg=name)
        np.testing.assert_array_equal(by_sorts, wanted, err_msg=name)
    assert [link.dtype for link in links] == [np.int64, np.int64, np.int64, np.int8]
    assert [link.dtype for link in sorted_links] == [link.dtype for link in links]


@settings(max_examples=40, deadline=None)
@given(layout=layouts())
def test_tree_links_are_the_child_lists_by_definition(layout: tuple) -> None:
    """Both constructions, the compiled pass (sibling lists of at most 16 distinct tokens)
    and NumPy's sorts (any), give the links by their definition."""
    _check_links_by_definition(layout)


@pytest.mark.slow  # the same property on many more layouts
@settings(max_examples=300, deadline=None)
@given(layout=layouts())
def test_tree_links_are_the_child_lists_by_definition_at_length(layout: tuple) -> None:
    _check_links_by_definition(layout)


def test_the_compiled_pass_gives_way_past_16_distinct_sibling_tokens() -> None:
    def compiled(tokens: np.ndarray) -> bool:
        total = tokens.shape[0]
        parents = np.full(total, -1, np.int64)
        links = [np.empty(total + 1, np.int64), *(np.empty(total, np.int64) for _ in "ab")]
        return _core.small_tree_links(
            np.array([0, total], np.int64), parents, tokens, *links, np.empty(total, np.int8)
        )

    assert compiled(np.arange(10000, dtype=np.int64) % 16)
    assert not compiled(np.arange(17, dtype=np.int64))
    many = np.arange(17, dtype=np.int64)
    links = _tree_links.tree_links(np.array([0, 17]), np.full(17, -1), many)
    np.testing.assert_array_equal(links.next_distinct_sibling, [*range(1, 17), -1])


def _call(parents: np.ndarray, links: Any) -> int:
    """A greedy ``verify_trees`` call on one request of these parents with these links."""
    total = parents.shape[0]
    target = np.full((total + 1, 4), 0.25)
    return _core.verify_trees(
        registry.get_tree_method("greedy").code, target, target, True,
        np.zeros(total, np.int64), parents, np.array([0, total], np.int64), *links,
        np.zeros(0), np.empty((1, total), np.int64), np.empty((1, total + 1), np.int64),
        np.empty(1, np.int64), np.empty(1, np.int64), 1,
    )  # fmt: skip


def _edited(links: _tree_links.TreeLinks, name: str, index: int, value: int) -> Any:
    arrays = [link.copy() for link in links]
    arrays[links._fields.index(name)][index] = value
    return arrays


@pytest.mark.parametrize(
    ("name", "index", "value"),
    [
        ("first_child", 0, 5),  # past the request
        ("first_child", 0, -2),  # neither a node nor -1
        ("first_child", 0, 1),  # a node whose parent is not the root
        ("first_child", 1, 0),  # backwards: a node's child must come after it
        ("next_sibling", 2, 2),  # a list that does not move forward (a cycle)
        ("next_sibling", 0, -1),  # a node left out of its parent's list
        ("next_sibling", 3, 3),
        ("next_distinct_sibling", 0, 4),  # a repeated node in the distinct list
        ("next_distinct_sibling", 0, 9),
        ("repeated_token", 0, 1),  # the first child is never a repeat
    ],
)
def test_the_driver_refuses_links_that_are_not_the_parents_lists(name, index, value) -> None:
    """A direct caller of the kernel module cannot make the walk leave the request or loop,
    whatever links it passes: each list must move forward through the children of its
    node, and reach every node (every node not marked repeated) once."""
    parents = np.array([-1, 0, -1, -1, -1], np.int64)
    tokens = np.array([3, 1, 7, 8, 3], np.int64)  # node 4 repeats node 0's token
    links = _tree_links.tree_links(np.array([0, 5]), parents, tokens)
    assert _call(parents, links) == -1
    with pytest.raises(ValueError, match="links"):
        _call(parents, _edited(links, name, index, value))


def test_the_driver_refuses_links_of_the_wrong_length() -> None:
    parents = np.array([-1, 0], np.int64)
    links = _tree_links.tree_links(np.array([0, 2]), parents, np.array([1, 2]))
    with pytest.raises(ValueError, match="links"):
        _call(parents, [links[0][:-1], *links[1:]])
