"""The collective protocol a sharded call needs, and its implementations.

A communicator has ``rank``, ``size`` and ``allgather(array)``, which returns a NumPy
array ``[size, *array.shape]`` holding every rank's array in rank order.  Every rank passes
an array of the same shape and dtype.  The library never implements a collective of its
own over a network: the adapters wrap mpi4py, NCCL and ``torch.distributed``, each
imported only when its adapter is built.  :class:`LocalCommunicator` joins threads of one
process (tests, trying it out).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Communicator",
    "LocalCommunicator",
    "MPICommunicator",
    "NCCLCommunicator",
    "TorchCommunicator",
    "run_local",
]


@runtime_checkable
class Communicator(Protocol):  # numpydoc ignore=PR01
    """What a sharded call needs of a collective library.

    Attributes
    ----------
    rank : int
        This process's (or thread's) index, ``0 <= rank < size``.
    size : int
        The number of ranks.

    Examples
    --------
    Any object with ``rank``, ``size`` and ``allgather`` will do; one rank alone:

    >>> import numpy as np
    >>> from specdec_np import sharded
    >>> class Alone:
    ...     rank, size = 0, 1
    ...     def allgather(self, array):
    ...         return array[np.newaxis]
    >>> sharded.verify_ragged(
    ...     communicator=Alone(), vocab_start=0, vocab_size=3,
    ...     num_draft_tokens=np.array([0]), draft_token_ids=np.array([], dtype=np.int64),
    ...     target_logits=np.array([[0.0, 2.0, 1.0]]), temperature=0.0).output_token_ids
    array([[1]])
    """

    rank: int
    size: int

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """Every rank's ``array``, stacked in rank order.

        Parameters
        ----------
        array : numpy.ndarray
            This rank's array; every rank passes the same shape and dtype.

        Returns
        -------
        numpy.ndarray
            ``[size, *array.shape]``, rank by rank.
        """
        ...


def _as_bytes(array: np.ndarray) -> np.ndarray:
    """A C-contiguous uint8 view of ``array`` (collectives move bytes; the dtype comes back
    by viewing the gathered bytes)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _from_bytes(gathered: np.ndarray, like: np.ndarray, size: int) -> np.ndarray:
    return gathered.view(like.dtype).reshape((size, *like.shape))


class _Room:
    """The shared state of one :func:`run_local` group: a slot per rank and a barrier."""

    def __init__(self, size: int, timeout: float | None) -> None:
        self.slots: list[np.ndarray | None] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)


class LocalCommunicator:
    """An in-memory communicator joining the threads of :func:`run_local`.

    Parameters
    ----------
    room : _Room
        The group's shared slots and barrier.
    rank : int
        This thread's rank.
    size : int
        The number of threads in the group.

    Examples
    --------
    :func:`run_local` makes one per thread:

    >>> import numpy as np
    >>> from specdec_np import sharded
    >>> sharded.run_local(2, lambda communicator: communicator.allgather(
    ...     np.array([communicator.rank, 10])).tolist())
    [[[0, 10], [1, 10]], [[0, 10], [1, 10]]]
    """

    def __init__(self, room: _Room, rank: int, size: int) -> None:
        self._room = room
        self.rank = rank
        self.size = size

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """Every thread's ``array`` in rank order.

        Parameters
        ----------
        array : numpy.ndarray
            This rank's array; every rank passes the same shape and dtype.

        Returns
        -------
        numpy.ndarray
            ``[size, *array.shape]``, rank by rank.

        Raises
        ------
        threading.BrokenBarrierError
            When another rank failed or the group's timeout passed (never a hang).
        """
        room = self._room
        room.slots[self.rank] = np.array(array, copy=True)
        room.barrier.wait()
        try:
            shapes = {(slot.shape, slot.dtype) for slot in room.slots if slot is not None}
            if len(shapes) != 1:
                raise ValueError(
                    "allgather needs the same shape and dtype on every rank; found "
                    f"{sorted(str(shape) for shape in shapes)}"
                )
            gathered = np.stack([slot for slot in room.slots if slot is not None])
        finally:
            # Nobody overwrites a slot before every rank has read them all.
            room.barrier.wait()
        return gathered


def run_local(
    size: int, function: Callable[[Any], Any], *, timeout: float | None = None
) -> list[Any]:
    """Call ``function(communicator)`` on ``size`` threads joined by an in-memory
    communicator, and return their results in rank order.

    Parameters
    ----------
    size : int
        The number of ranks (threads), at least 1.
    function : callable
        Called once per rank with that rank's :class:`LocalCommunicator`.
    timeout : float, optional
        Seconds any rank may wait in one ``allgather``; None waits as long as it takes
        (a rank that raises still releases the others).

    Returns
    -------
    list
        ``function``'s result on rank 0, 1, ...

    Raises
    ------
    Exception
        The exception of the lowest rank that raised one (ranks that only saw the group
        break, because another rank raised, do not hide it).

    Examples
    --------
    >>> from specdec_np import sharded
    >>> sharded.run_local(3, lambda communicator: (communicator.rank, communicator.size))
    [(0, 3), (1, 3), (2, 3)]
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"size must be an int >= 1; found {size!r}")
    room = _Room(size, timeout)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def work(rank: int) -> None:
        try:
            results[rank] = function(LocalCommunicator(room, rank, size))
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            errors[rank] = error
            # The others must not wait for this rank's next allgather forever.
            room.barrier.abort()

    threads = [threading.Thread(target=work, args=(rank,), daemon=True) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    broken = [e for e in errors if e is not None]
    if broken:
        raise broken[0]
    return results


class MPICommunicator:
    """An mpi4py communicator (``pip install "specdec_np[mpi]"``).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm, optional
        ``MPI.COMM_WORLD`` if None.

    Examples
    --------
    In each process of ``mpiexec -n 2 python script.py`` (``examples/sharded_mpi.py`` is a
    whole one):

    >>> import numpy as np
    >>> from specdec_np import sharded
    >>> communicator = sharded.MPICommunicator()  # doctest: +SKIP
    >>> communicator.allgather(np.array([communicator.rank])).tolist()  # doctest: +SKIP
    [[0], [1]]
    """

    def __init__(self, comm: Any = None) -> None:
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        self._comm = comm
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """``MPI_Allgather`` of the array's bytes.

        Parameters
        ----------
        array : numpy.ndarray
            This rank's array; every rank passes the same shape and dtype.

        Returns
        -------
        numpy.ndarray
            ``[size, *array.shape]``, rank by rank.
        """
        send = _as_bytes(np.asarray(array))
        received = np.empty(self.size * send.size, dtype=np.uint8)
        self._comm.Allgather(send, received)
        return _from_bytes(received, np.asarray(array), self.size)


class NCCLCommunicator:
    """A ``cupy.cuda.nccl.NcclCommunicator`` (GPU ranks; the statistics travel through
    device buffers of the current device).

    Parameters
    ----------
    comm : cupy.cuda.nccl.NcclCommunicator
        An initialised NCCL communicator of this rank.
    stream : cupy.cuda.Stream, optional
        The stream the collective runs on (the current one if None).

    Examples
    --------
    In each process of a two-GPU group, with the NCCL unique id shared beforehand (by MPI
    or a file):

    >>> import cupy  # doctest: +SKIP
    >>> import numpy as np
    >>> from cupy.cuda import nccl  # doctest: +SKIP
    >>> from specdec_np import sharded
    >>> cupy.cuda.Device(rank).use()  # doctest: +SKIP
    >>> communicator = sharded.NCCLCommunicator(
    ...     nccl.NcclCommunicator(2, unique_id, rank))  # doctest: +SKIP
    >>> communicator.allgather(np.array([communicator.rank])).tolist()  # doctest: +SKIP
    [[0], [1]]
    """

    def __init__(self, comm: Any, stream: Any = None) -> None:
        self._comm = comm
        self._stream = stream
        self.rank = int(comm.rank_id())
        self.size = int(comm.size())

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """``ncclAllGather`` of the array's bytes, copied back to the host.

        Parameters
        ----------
        array : numpy.ndarray
            This rank's array; every rank passes the same shape and dtype.

        Returns
        -------
        numpy.ndarray
            ``[size, *array.shape]``, rank by rank.
        """
        import cupy
        from cupy.cuda import nccl

        host = np.asarray(array)
        send = cupy.asarray(_as_bytes(host))
        received = cupy.empty(self.size * send.size, dtype=cupy.uint8)
        stream = self._stream or cupy.cuda.get_current_stream()
        self._comm.allGather(
            send.data.ptr, received.data.ptr, send.size, nccl.NCCL_UINT8, stream.ptr
        )
        stream.synchronize()
        return _from_bytes(cupy.asnumpy(received), host, self.size)


class TorchCommunicator:
    """A ``torch.distributed`` process group (an engine's own tensor-parallel group).

    The package never imports torch: the engine hands over its own ``torch.distributed``
    module, and the tensors are made by the torch that module belongs to.

    Parameters
    ----------
    distributed : module
        The caller's ``torch.distributed``.
    group : torch.distributed.ProcessGroup, optional
        The default group if None.
    device : str or torch.device, optional
        Where the gathered bytes live: ``"cpu"`` for gloo, a CUDA device for NCCL groups.

    Examples
    --------
    A gloo group of one process (an engine passes its tensor-parallel group):

    >>> import numpy as np
    >>> import torch.distributed as distributed
    >>> from specdec_np import sharded
    >>> distributed.init_process_group("gloo", store=distributed.HashStore(), rank=0,
    ...                                world_size=1)
    >>> sharded.TorchCommunicator(distributed).allgather(np.arange(3)).tolist()
    [[0, 1, 2]]
    >>> distributed.destroy_process_group()
    """

    def __init__(self, distributed: Any, group: Any = None, device: Any = "cpu") -> None:
        root = getattr(distributed, "__name__", "").split(".", 1)[0]
        if root != "torch" or "torch" not in sys.modules:
            raise TypeError(
                f"distributed must be the torch.distributed module; found {distributed!r}"
            )
        self._torch = sys.modules["torch"]
        self._distributed = distributed
        self._group = group
        self._device = device
        self.rank = int(distributed.get_rank(group))
        self.size = int(distributed.get_world_size(group))

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """``all_gather`` of the array's bytes as uint8 tensors.

        Parameters
        ----------
        array : numpy.ndarray
            This rank's array; every rank passes the same shape and dtype.

        Returns
        -------
        numpy.ndarray
            ``[size, *array.shape]``, rank by rank.
        """
        torch = self._torch
        host = np.asarray(array)
        send = torch.from_numpy(_as_bytes(host).copy()).to(self._device)
        received = [torch.empty_like(send) for _ in range(self.size)]
        self._distributed.all_gather(received, send, group=self._group)
        gathered = np.concatenate([part.cpu().numpy() for part in received])
        return _from_bytes(gathered, host, self.size)
