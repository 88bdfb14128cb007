"""Every round of a sharded call goes through :class:`Exchange`, which counts the bytes
this rank hands the communicator; :func:`agree` is the first round, which makes
disagreeing or badly sharded ranks a ValueError on every rank instead of a hang."""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

__all__ = ["DIGEST_BYTES", "Exchange", "Shard", "agree", "digest"]

#: The width of the settings digest each rank sends in the agreement round.
DIGEST_BYTES = 32


class Exchange:
    """A communicator that counts what this rank sends.

    Parameters
    ----------
    communicator : Communicator
        ``rank``, ``size`` and ``allgather(array) -> [size, *array.shape]``.
    """

    def __init__(self, communicator: Any) -> None:
        for name in ("rank", "size", "allgather"):
            if not hasattr(communicator, name):
                raise TypeError(
                    f"communicator must have rank, size and allgather; {type(communicator)!r} "
                    f"has no {name}"
                )
        self.communicator = communicator
        self.rank = int(communicator.rank)
        self.size = int(communicator.size)
        self.sent_bytes = 0
        self.rounds = 0

    def gather(self, array: np.ndarray) -> np.ndarray:
        """``allgather`` of ``array`` (every rank passes the same shape and dtype), as a
        NumPy array ``[size, *array.shape]``."""
        array = np.ascontiguousarray(array)
        self.sent_bytes += int(array.nbytes)
        self.rounds += 1
        gathered = np.asarray(self.communicator.allgather(array))
        if gathered.shape != (self.size, *array.shape):
            raise RuntimeError(
                f"the communicator's allgather returned shape {gathered.shape}; expected "
                f"{(self.size, *array.shape)}"
            )
        return gathered.astype(array.dtype, copy=False)

    def gather_many(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """One ``allgather`` of several arrays (their bytes end to end); each comes back
        as :meth:`gather` returns it."""
        parts = [np.ascontiguousarray(array) for array in arrays]
        buffer = np.concatenate([part.reshape(-1).view(np.uint8) for part in parts])
        gathered = self.gather(buffer)
        out = []
        offset = 0
        for part in parts:
            piece = np.ascontiguousarray(gathered[:, offset : offset + part.nbytes])
            out.append(piece.view(part.dtype).reshape(self.size, *part.shape))
            offset += part.nbytes
        return out


def digest(*parts: Any) -> np.ndarray:
    """A fixed-size digest (uint8 ``[DIGEST_BYTES]``) of the values every rank must share:
    arrays by dtype, shape and bytes, everything else by ``repr``."""
    # The bytes end to end, hashed at once: the digest of updating part by part.
    # An array's bytes in C order (tobytes' own order), its shape at least 1-d (as
    # np.ascontiguousarray made it, which the digest's bytes keep).
    chunks = [
        f"{part.dtype.str}{part.shape or (1,)}".encode() + part.tobytes()
        if isinstance(part, np.ndarray) else repr(part).encode()
        for part in parts
    ]
    chunks.append(b"")
    hashed = hashlib.sha256(b"|".join(chunks)).digest()
    return np.frombuffer(hashed, dtype=np.uint8)[:DIGEST_BYTES]


class Shard(NamedTuple):
    """Where every rank's columns lie, in rank order (agreed on every rank), and the ranks
    in vocabulary order (``ranks``: sorted once, read by every draw)."""

    starts: np.ndarray
    widths: np.ndarray
    ranks: np.ndarray

    def order(self) -> np.ndarray:
        """Ranks in vocabulary order (the order of the inverse-CDF draws)."""
        return self.ranks


def agree(
    exchange: Exchange,
    vocab_start: int,
    width: int,
    vocab_size: int,
    settings: np.ndarray | None,
    local_error: BaseException | None,
) -> Shard:
    """The agreement round: one allgather of ``[ok, vocab_start, width, vocab_size,
    digest]`` per rank.

    Parameters
    ----------
    exchange : Exchange
    vocab_start, width, vocab_size : int
        This rank's columns and the vocabulary it believes in.
    settings : uint8 [DIGEST_BYTES] or None
        :func:`digest` of everything every rank must share (None with ``local_error``).
    local_error : exception or None
        What this rank's own checks refused; every other rank then raises too.

    Returns
    -------
    Shard

    Raises
    ------
    ValueError
        On every rank, when any rank refused its input, the ranks' digests or vocabulary
        sizes differ, or the shards do not tile ``0 .. vocab_size - 1`` exactly.
    """
    record = np.zeros(4 + DIGEST_BYTES, dtype=np.int64)
    record[0] = 0 if local_error is None else 1
    if local_error is None and settings is not None:
        record[1:4] = (vocab_start, width, vocab_size)
        record[4:] = settings
    table = exchange.gather(record)
    # The table as Python ints: a few ranks' dozens of numbers, checked without NumPy's
    # per-operation cost.
    records = table.tolist()
    failed = [rank for rank, row in enumerate(records) if row[0]]
    if failed:
        if local_error is not None:
            raise local_error
        raise ValueError(
            f"rank {failed[0]} refused its input of the sharded call (its own error "
            "names the argument)"
        )
    sizes = [row[3] for row in records]
    if any(size != sizes[0] for size in sizes):
        raise ValueError(
            f"vocab_size must be the same on every rank; found {sorted(set(sizes))} "
            f"(rank by rank: {sizes})"
        )
    different = [rank for rank, row in enumerate(records) if row[4:] != records[0][4:]]
    if different:
        raise ValueError(
            f"rank {different[0]} was given other settings, token ids or randomness "
            "than rank 0 (the sampling parameters, num_draft_tokens, draft_token_ids, "
            "bonus_token_ids, the method, the row forms and the uniforms must be the same "
            "on every rank)"
        )
    start_list = [row[1] for row in records]
    width_list = [row[2] for row in records]
    # A stable sort, as np.argsort(kind="stable") orders the ranks.
    ranks = sorted(range(len(records)), key=start_list.__getitem__)
    shard = Shard(table[:, 1].copy(), table[:, 2].copy(), np.array(ranks, dtype=np.int64))
    if sum(width_list) != vocab_size:
        raise ValueError(
            f"the shards' widths {width_list} add up to {sum(width_list)}, not "
            f"vocab_size = {vocab_size}"
        )
    end = 0
    for rank in ranks:
        if width_list[rank] == 0:
            continue
        if start_list[rank] != end:
            kind = "overlaps the shard before it" if start_list[rank] < end else "leaves a gap"
            raise ValueError(
                f"rank {rank}'s shard (vocab_start={start_list[rank]}, width="
                f"{width_list[rank]}) {kind}: the shards must tile 0 .. vocab_size - 1"
            )
        end += width_list[rank]
    return shard
