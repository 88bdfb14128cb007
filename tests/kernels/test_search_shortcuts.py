"""The searches of the filters' selections (specdec_np/_kernels/src/cpu/survivors.h) and their
shortcuts, which must find what the plain searches find, bit for bit.

* The logit floor (the smallest logit whose ``z`` reaches a threshold) starts from a bracket
  around ``threshold * temperature``; its obviously correct twin, written here, bisects over
  every bit of the keys.  The division is monotone, so the two find one key.
* The radix select over a set that fits the scratch reads the set once and then only the
  entries of the bucket it chose; the headers built with room for 3 such entries
  (SPECDEC_TOP_P_CANDIDATES=3) read the whole set in every pass.

Wrong variants (the floor's guess taken as the answer; a select that stops with two entries
left) must be caught.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_headers import build_library

from specdec_np._sharded.rows import ordered_keys

_WRAPPER = r"""
#include <stdlib.h>
#include "logits_law.h"

#define T_SEARCHES(SUFFIX, T, KEY_T, INFINITY_T)                                            \
    T t_floor_##SUFFIX(T threshold, T temperature)                                         \
    {                                                                                      \
        return specdec_logit_floor_##SUFFIX(threshold, temperature);                       \
    }                                                                                      \
    /* One bisection step per key bit, from the whole range of keys. */                    \
    T t_bisection_##SUFFIX(T threshold, T temperature)                                     \
    {                                                                                      \
        KEY_T low = specdec_key_##SUFFIX(-INFINITY_T), high = specdec_key_##SUFFIX(INFINITY_T); \
        if (specdec_value_##SUFFIX(low) / temperature >= threshold)                        \
            return specdec_value_##SUFFIX(low);                                            \
        while (high - low > 1) {                                                           \
            KEY_T middle = low + (high - low) / 2;                                         \
            if (specdec_value_##SUFFIX(middle) / temperature >= threshold)                 \
                high = middle;                                                             \
            else                                                                           \
                low = middle;                                                              \
        }                                                                                  \
        return specdec_value_##SUFFIX(high);                                               \
    }                                                                                      \
    KEY_T t_select_##SUFFIX(const T *z, ptrdiff_t n, const T *w, KEY_T floor_key,          \
                            int by_mass, double need)                                      \
    {                                                                                      \
        specdec_law_scratch *scratch = specdec_law_scratch_new();                          \
        KEY_T key = specdec_select_##SUFFIX(z, n, (T)1, (T)0, floor_key, by_mass, need,     \
                                            by_mass ? w : NULL, scratch);                  \
        free(scratch);                                                                     \
        return key;                                                                        \
    }

T_SEARCHES(f, float, uint32_t, (float)INFINITY)
T_SEARCHES(d, double, uint64_t, (double)INFINITY)
"""

_SCALARS = {np.float32: ("f", ctypes.c_float, ctypes.c_uint32),
            np.float64: ("d", ctypes.c_double, ctypes.c_uint64)}  # fmt: skip


class Searches:
    def __init__(self, lib: Any) -> None:
        self.lib = lib
        for kind, scalar, key in _SCALARS.values():
            for name in ("floor", "bisection"):
                function = getattr(lib, f"t_{name}_{kind}")
                function.argtypes = [scalar, scalar]
                function.restype = scalar
            select = getattr(lib, f"t_select_{kind}")
            select.argtypes = [
                ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p, key, ctypes.c_int,
                ctypes.c_double,
            ]  # fmt: skip
            select.restype = key

    def floor(self, name: str, dtype: type, threshold: float, temperature: float) -> Any:
        kind = _SCALARS[dtype][0]
        return dtype(getattr(self.lib, f"t_{name}_{kind}")(threshold, temperature))

    def select(self, z: np.ndarray, w: np.ndarray, floor_key: int, by_mass: int,
               need: float) -> int:  # fmt: skip
        kind = _SCALARS[z.dtype.type][0]
        return int(getattr(self.lib, f"t_select_{kind}")(
            z.ctypes.data, z.size, w.ctypes.data, floor_key, by_mass, need
        ))  # fmt: skip


def _build(tmp: Path, stem: str, *defines: str) -> Searches:
    return Searches(build_library(tmp, stem, _WRAPPER, *defines))


@pytest.fixture(scope="module")
def searches(tmp_path_factory: pytest.TempPathFactory) -> Searches:
    return _build(tmp_path_factory.mktemp("searches"), "searches")


@pytest.fixture(scope="module")
def whole_set_passes(tmp_path_factory: pytest.TempPathFactory) -> Searches:
    """Room for 3 members: a select over more reads its whole set in every pass."""
    return _build(tmp_path_factory.mktemp("whole"), "whole", "-DSPECDEC_TOP_P_CANDIDATES=3")


# ---- the logit floor -------------------------------------------------------------------


def _floor_cases(dtype: type, seed: int) -> list[tuple[Any, Any]]:
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    specials = [0.0, -0.0, info.tiny, -info.tiny, info.smallest_subnormal,
                -info.smallest_subnormal, info.max, -info.max, np.inf, -np.inf, np.nan, 1.0,
                -1.0, 1e-30, 12.5]  # fmt: skip
    magnitudes = 10.0 ** rng.uniform(-40, 38, 300)
    thresholds = [*specials, *(magnitudes * rng.choice([-1.0, 1.0], magnitudes.size))]
    # Nearby logits at the usual scale: a survivor's floor divided by the temperature.
    thresholds += list(rng.normal(0.0, 8.0, 300))
    temperatures = [1e-3, 0.1, 0.3, 0.5, 0.7, 0.8, 1.0, 1.3, 2.0, 7.0, 1e3, 1e-20, 3e20]
    cases = []
    for threshold in thresholds:
        for temperature in temperatures:
            cases.append((dtype(threshold), dtype(temperature)))
    return cases


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_logit_floor_is_the_bisections(searches: Searches, dtype: type) -> None:
    with np.errstate(all="ignore"):
        for threshold, temperature in _floor_cases(dtype, 0):
            found = searches.floor("floor", dtype, threshold, temperature)
            expected = searches.floor("bisection", dtype, threshold, temperature)
            assert np.array([found]).tobytes() == np.array([expected]).tobytes(), (
                threshold, temperature, found, expected)  # fmt: skip
            if not np.isnan(threshold) and not np.isinf(found):
                # The definition: it reaches the threshold, the logit below it does not.
                assert found / temperature >= threshold
                below = np.nextafter(found, dtype(-np.inf))
                assert below == found or not below / temperature >= threshold


def test_a_floor_that_takes_its_guess_is_caught(tmp_path: Path) -> None:
    wrong = _build(tmp_path, "mutation10", "-DSPECDEC_LOGITS_MUTATION=10")
    differs = 0
    with np.errstate(all="ignore"):
        for threshold, temperature in _floor_cases(np.float32, 1):
            found = wrong.floor("floor", np.float32, threshold, temperature)
            expected = wrong.floor("bisection", np.float32, threshold, temperature)
            differs += np.array([found]).tobytes() != np.array([expected]).tobytes()
    assert differs > 0


# ---- the radix select over a set that fits -------------------------------------------


def _select_cases(dtype: type, seed: int, count: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    cases = []
    for case in range(count):
        n = int(rng.integers(4, 300))
        z = rng.normal(0.0, 3.0, n)
        if case % 3 == 1:
            z = np.round(z * 4.0) / 4.0  # ties: buckets that hold one key many times
        elif case % 3 == 2:
            z = 10.0 + rng.normal(0.0, 1e-3, n)  # one first-pass bucket, split later
        z = z.astype(dtype)
        w = np.exp(z - z.max()).astype(dtype)
        by_mass = case % 2
        need = float(rng.uniform(0.05, 1.0)) if by_mass else float(rng.integers(1, n + 1))
        # A floor below which entries are not counted (1: every entry that is not NaN).
        floor = np.sort(z)[int(rng.integers(0, n // 2))] if case % 4 == 3 else None
        floor_key = 1 if floor is None else int(ordered_keys(np.array([floor]))[0])
        cases.append((z, w, floor_key, by_mass, need))
    return cases


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_select_over_its_members_is_the_whole_sets(
    searches: Searches, whole_set_passes: Searches, dtype: type
) -> None:
    for z, w, floor_key, by_mass, need in _select_cases(dtype, 2, 400):
        assert searches.select(z, w, floor_key, by_mass, need) == whole_set_passes.select(
            z, w, floor_key, by_mass, need)  # fmt: skip


def test_a_select_that_stops_a_pass_early_is_caught(
    tmp_path: Path, whole_set_passes: Searches
) -> None:
    wrong = _build(tmp_path, "mutation11", "-DSPECDEC_LOGITS_MUTATION=11")
    differs = sum(
        wrong.select(*case) != whole_set_passes.select(*case)
        for case in _select_cases(np.float32, 3, 400)
    )
    assert differs > 0
