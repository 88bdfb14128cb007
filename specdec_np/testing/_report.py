"""The conformance kit's report, its time limit and how it reads a verifier's signature.

Shared by every layout of the kit (:mod:`specdec_np.testing._padded`,
:mod:`specdec_np.testing._ragged`, :mod:`specdec_np.testing._tree`); :mod:`specdec_np.testing`
is the public front that re-exports the report classes.

A property is passed, failed or skipped: a skipped property did not run (the verifier
lacks the keyword it needs, the kind has no oracle, or an earlier call hung), and it counts
neither as passed nor as failed (``docs/testing.md``, the skip flag); a report in which no
property ran is not a pass.  Every call to the verifier goes through a :class:`TimeLimit`:
it runs in a daemon thread the kit waits on for at most ``seconds``; a call that does not
return by then fails its property with :class:`VerifierTimeout`, and the kit calls that
verifier no more (the properties left are skipped), since a Python thread cannot be
stopped from outside.  A verifier that raises, ``SystemExit`` and other
``BaseException`` subclasses included, fails the property it was in (:func:`guard`); only
``KeyboardInterrupt`` stops the kit.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TIMEOUT",
    "ConformanceError",
    "ConformanceReport",
    "PropertyResult",
    "TimeLimit",
    "VerifierTimeout",
    "checked_timeout",
    "guard",
    "has_keyword",
    "positional_count",
    "skipped",
]

#: The default time limit of one call to the verifier, in seconds (``docs/testing.md``).
DEFAULT_TIMEOUT = 60.0


def checked_timeout(timeout: Any) -> float | None:
    """``timeout`` as the float seconds :class:`TimeLimit` takes, or None (no limit).

    Parameters
    ----------
    timeout : float or None
        Seconds, positive, finite and at most ``threading.TIMEOUT_MAX`` (the longest wait
        this platform's threads can make; a longer one would make every call fail with an
        OverflowError, each property failed for the kit's own reason).

    Returns
    -------
    float or None

    Raises
    ------
    ValueError
        For anything else, with the accepted range.
    """
    if timeout is None:
        return None
    if not isinstance(timeout, bool) and isinstance(timeout, (int, float, np.integer,
                                                               np.floating)):
        seconds = float(timeout)
        if 0 < seconds <= threading.TIMEOUT_MAX:
            return seconds
    raise ValueError(f"timeout must be None or a number of seconds in (0, "
                     f"{threading.TIMEOUT_MAX:g}] (the longest wait of this platform's "
                     f"threads); found {timeout!r}")


@dataclass(frozen=True)
class PropertyResult:  # numpydoc ignore=PR01
    """One row of a :class:`ConformanceReport`.

    Attributes
    ----------
    name : str
        The property checked.
    passed : bool
        True only when the property ran and held; False when the verifier violates it,
        crashed or hung while checked, and also when it did not run (see ``skipped``).
    figure : str
        The measured number, short (``"max err 3e-17"``, ``"p = 0.41"``, ``"skipped"``).
    detail : str
        What was fed and what was found, for a human (for a skipped property: why).
    skipped : bool
        The property did not run; it is neither passed nor failed.

    Examples
    --------
    >>> import specdec_np
    >>> from specdec_np.testing import check_verifier
    >>> row = check_verifier(specdec_np.greedy_sample, "greedy", num_rows=1000).rows[0]
    >>> row.passed, row.skipped
    (True, False)
    """

    name: str
    passed: bool
    figure: str
    detail: str
    skipped: bool = False

    @property
    def status(self) -> str:
        """``"PASS"``, ``"FAIL"`` or ``"SKIP"``."""
        if self.skipped:
            return "SKIP"
        return "PASS" if self.passed else "FAIL"


def skipped(name: str, reason: str) -> PropertyResult:
    """A property that did not run, with the reason.

    Parameters
    ----------
    name : str
    reason : str

    Returns
    -------
    PropertyResult
        ``passed`` False, ``skipped`` True, figure ``"skipped"``.
    """
    return PropertyResult(name, False, "skipped", reason, skipped=True)


class ConformanceError(AssertionError):
    """Raised by :meth:`ConformanceReport.raise_if_failed`; the message is the report.

    Examples
    --------
    A "greedy" verifier that accepts every draft:

    >>> import numpy as np
    >>> from specdec_np.testing import ConformanceError, check_verifier
    >>> def accept_all(target_with_bonus_probs, bonus_token_ids, draft_token_ids):
    ...     return np.concatenate([draft_token_ids, bonus_token_ids], axis=1)
    >>> try:
    ...     check_verifier(accept_all, "greedy", num_rows=1000).raise_if_failed()
    ... except ConformanceError as error:
    ...     print(str(error).splitlines()[0])  # doctest: +ELLIPSIS
    accept_all fails ...
    """


@dataclass
class ConformanceReport:  # numpydoc ignore=PR01
    """The outcome of :func:`specdec_np.testing.check_verifier`.

    Attributes
    ----------
    kind : str
        The kind checked.
    verifier : str
        The verifier's name.
    rows : list of PropertyResult
        One per property, in the order checked.
    seconds : float
        Wall-clock time of the whole run.
    layout : str
        ``"padded"``, ``"ragged"`` or ``"tree"``.

    Examples
    --------
    >>> import specdec_np
    >>> from specdec_np.testing import check_verifier
    >>> report = check_verifier(specdec_np.greedy_sample, "greedy", num_rows=1000)
    >>> report.passed, report.verifier, report.layout
    (True, 'greedy_sample', 'padded')
    >>> report.raise_if_failed()
    """

    kind: str
    verifier: str
    rows: list[PropertyResult] = field(default_factory=list)
    seconds: float = 0.0
    layout: str = "padded"

    @property
    def passed(self) -> bool:
        """True iff no property failed (skipped ones neither pass nor fail) and at least
        one ran."""
        return not self.failed() and self.ran() > 0

    def ran(self) -> int:
        """How many properties ran (passed or failed).

        Returns
        -------
        int
            The rows that are not skipped.
        """
        return sum(not row.skipped for row in self.rows)

    def failed(self) -> list[str]:
        """Names of the failed properties.

        Returns
        -------
        list of str
            In the order checked; empty when none failed.
        """
        return [row.name for row in self.rows if not row.passed and not row.skipped]

    def skipped(self) -> list[str]:
        """Names of the properties that did not run.

        Returns
        -------
        list of str
            In the order checked.
        """
        return [row.name for row in self.rows if row.skipped]

    def __str__(self) -> str:
        header = ("property", "result", "figure", "detail")
        cells = [(r.name, r.status, r.figure, r.detail) for r in self.rows]
        widths = [max(len(row[i]) for row in [header, *cells]) for i in range(3)]

        def line(row: tuple[str, ...]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]

        failures, skips = len(self.failed()), len(self.skipped())
        if failures:
            verdict = f"{failures} FAILED"
        elif self.ran():
            verdict = "all passed"
        else:  # nothing was tested: saying "passed" would be a false pass
            verdict = "NOT PASSED: none ran"
        if skips:
            verdict += f", {skips} skipped"
        where = "" if self.layout == "padded" else f", layout {self.layout!r}"
        return "\n".join(
            [
                f"conformance of {self.verifier} (kind {self.kind!r}{where})",
                line(header),
                line(tuple("-" * w for w in widths) + ("-" * 6,)),
                *(line(row) for row in cells),
                f"{len(self.rows)} properties, {verdict} [{self.seconds:.1f} s]",
            ]
        )

    def raise_if_failed(self) -> None:
        """Raise :class:`ConformanceError` (an ``AssertionError``) if any property failed.

        Raises
        ------
        ConformanceError
            With the failed property names and the whole report as the message.
        """
        if not self.passed:
            failed = ", ".join(self.failed()) or "every property (none ran)"
            raise ConformanceError(f"{self.verifier} fails {failed}\n{self}")


class VerifierTimeout(Exception):
    """A call to the verifier did not return within the kit's time limit."""


class TimeLimit:
    """Calls the verifier with a time limit; after one call hangs, refuses further calls.

    Parameters
    ----------
    seconds : float or None
        The limit of one call; None calls the verifier directly, without a limit.
    """

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        #: Why the verifier is no longer called (set by the first call that hung).
        self.hung: str | None = None

    def call(self, function: Callable[..., Any], *args: Any, **keywords: Any) -> Any:
        """``function(*args, **keywords)``, or :class:`VerifierTimeout` after ``seconds``.

        Parameters
        ----------
        function : callable
        *args, **keywords
            Its arguments.

        Returns
        -------
        object
            What it returned; what it raised is raised again.

        Raises
        ------
        VerifierTimeout
            If it did not return in time, or an earlier call hung.
        """
        if self.hung is not None:
            raise VerifierTimeout(self.hung)
        if self.seconds is None:
            return function(*args, **keywords)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = function(*args, **keywords)
            except BaseException as error:  # handed to the caller's thread
                outcome["error"] = error

        # A daemon thread: a verifier that never returns cannot keep the process alive.
        worker = threading.Thread(target=run, name="specdec-np-kit-call", daemon=True)
        worker.start()
        worker.join(self.seconds)
        if worker.is_alive():
            self.hung = (
                f"a call to the verifier did not return within the time limit of "
                f"{self.seconds:g} s (timeout=); it was left running and not called again"
            )
            raise VerifierTimeout(self.hung)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


def guard(name: str, step: Callable[[], Any], limit: TimeLimit) -> list[PropertyResult]:
    """Run one check step: its rows, one failed row if it raised, one skipped row if the
    verifier hung before it.

    Parameters
    ----------
    name : str
        The property named when the step yields no rows of its own.
    step : callable
        Returns a PropertyResult or a list of them.
    limit : TimeLimit
        The verifier's limit (read for an earlier hang).

    Returns
    -------
    list of PropertyResult
    """
    if limit.hung is not None:
        return [skipped(name, f"not run: {limit.hung}")]
    try:
        outcome = step()
    except VerifierTimeout as error:
        return [PropertyResult(name, False, "timed out", str(error))]
    except KeyboardInterrupt:
        # How Ctrl-C arrives: the person running the kit wants it stopped.
        raise
    except BaseException as error:
        # A crash is a failed property, with its reason; sys.exit() in a verifier too,
        # which would otherwise end the kit (and `specdec-np check`, with status 0) with
        # no report.
        return [PropertyResult(name, False, "raised", f"{type(error).__name__}: {error}")]
    return outcome if isinstance(outcome, list) else [outcome]


def has_keyword(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes keyword ``name``: a ``takes_<name>`` attribute if it declares
    one, else its signature: an explicit parameter, or ``**kwargs``, which takes every
    keyword (the usual adapter, ``def verify(**kwargs): return engine.verify(**kwargs)``).

    Parameters
    ----------
    fn : callable
    name : str

    Returns
    -------
    bool
    """
    declared = getattr(fn, f"takes_{name}", None)
    if declared is not None:
        return bool(declared)
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    parameter = parameters.get(name)
    return parameter is not None and parameter.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def positional_count(fn: Any) -> int | None:
    """The positional parameters of ``fn`` (a ``positional_arguments`` attribute if it
    declares one); None for ``*args`` or an unreadable signature.

    Parameters
    ----------
    fn : callable

    Returns
    -------
    int or None
    """
    declared = getattr(fn, "positional_arguments", None)
    if declared is not None:
        return int(declared)
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return None
    return sum(
        k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for k in kinds
    )


class UnsupportedKeyword(Exception):
    """The verifier's signature lacks a keyword a check needs: the check is skipped."""


def layout_keywords(
    takes: dict[str, bool], values: dict[str, Any], required: tuple[str, ...], kind: str
) -> dict[str, Any]:
    """The keywords to pass a layout verifier: the ``required`` ones, the others it takes,
    None values dropped where it lacks the keyword, and ``method=kind`` when it takes one.

    Raises
    ------
    UnsupportedKeyword
        For a value the verifier has no keyword for.
    """
    keywords = {}
    for name, value in values.items():
        if name in required or takes.get(name):
            keywords[name] = value
        elif value is not None:
            raise UnsupportedKeyword(f"the verifier takes no {name}= keyword")
    if takes.get("method"):
        keywords["method"] = kind
    return keywords


def guard_keywords(name: str, step: Callable[[], Any], limit: TimeLimit) -> list[PropertyResult]:
    """:func:`guard`, with a keyword the verifier lacks reported as a skip."""

    def unsupported_as_skip() -> Any:
        try:
            return step()
        except UnsupportedKeyword as missing:
            return [skipped(name, str(missing))]

    return guard(name, unsupported_as_skip, limit)


def greedy_result(name: str, count: int, wrong: list[str], rule: str) -> PropertyResult:
    """The greedy requests mixed into a layout's batches: ``count`` checked against
    ``rule``, ``wrong`` the descriptions of those that broke it; skipped when none ran."""
    if not count:
        return skipped(name, "no batch with greedy requests ran")
    detail = "; ".join(wrong[:2]) if wrong else f"{count} {rule}"
    return PropertyResult(name, not wrong, f"{len(wrong)}/{count} wrong", detail)


def format_result(name: str, problems: list[str], count: int, form: str) -> PropertyResult:
    """A layout's output format over ``count`` checked requests of the form ``form``;
    skipped when no call returned an output."""
    if not problems and not count:
        return skipped(name, "no call returned an output to check")
    detail = "; ".join(problems[:3]) if problems else f"{count} requests: {form}"
    return PropertyResult(name, not problems, f"{len(problems)} problems", detail)
