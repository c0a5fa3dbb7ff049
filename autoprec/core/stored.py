"""ONNX models whose weights stay on disk: a graph in memory, every tensor over ``INLINE_BYTES`` in
a data file.

Protobuf cannot hold 2 GB, and each copy of a model's weights costs memory and time, so autoprec
keeps one copy of every weight in one folder (the prepared model's) and passes graphs around: a
:class:`StoredModel` is a ``ModelProto`` whose large tensors are external-data references relative
to its ``folder``. An engine loads it from a file written there (ONNX Runtime memory-maps the
weights, TensorRT's parser reads them beside the file); lowering adds the tensors it makes (INT8 or
FP16 copies of weights) to the same folder, once each. Exports copy what they reference into a
self-contained file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autoprec.core import atomic

INLINE_BYTES = 1024  # smaller tensors stay in the graph: shape constants, scalars, most scales
# each tensor starts on a page of its data file: ONNX Runtime memory-maps aligned external data
ALIGN = 4096
COPY_CHUNK = 64 << 20  # bytes per read when a tensor is copied between data files
# external tensors up to this size are read; larger ones memory-mapped (see read_tensor)
READ_BYTES = 1 << 20
# An export at or above this many bytes of weights keeps them in a data file beside the model
# (ONNX's external data), below it in the .onnx file itself, unless the model came with external
# data.
EXTERNAL_EXPORT_BYTES = 1 << 30
DERIVED = "derived"  # the folder's sub-folder of tensors lowering made
# A tensor lowering makes up to this size stays in the graph (kept in memory, per process): an
# engine loads hundreds of small weights from one graph faster than from as many files (300 units:
# 17 % faster).
DERIVED_INLINE_BYTES = 16 << 10

_written = itertools.count()
_write_lock = threading.Lock()
_derived: dict[
    tuple[str, str], TensorProto
] = {}  # (folder, name) -> a derived tensor made or found (fixed by its name)


def tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every tensor a graph holds: initializers and attribute tensors, in subgraphs too."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for subgraph in [*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs]:
                yield from tensors(subgraph)


def is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def external_info(tensor: TensorProto) -> tuple[str, int, int | None]:
    """(location, offset, length or None) of an external tensor."""
    entries = {e.key: e.value for e in tensor.external_data}
    length = entries.get("length")
    return entries["location"], int(entries.get("offset", 0)), int(length) if length is not None else None


def nbytes(tensor: TensorProto) -> int:
    """Bytes of a tensor's values (inline or external), from its type and dims."""
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return math.prod(tensor.dims) * np.dtype(dtype).itemsize


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of every tensor of a model: what "the weights" means in memory and scale figures."""
    return sum(nbytes(t) for t in tensors(model.graph) if t.data_type != TensorProto.STRING)


def _set_external(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    tensor.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


PACKED_4BIT = (TensorProto.INT4, TensorProto.UINT4)


def read_tensor(tensor: TensorProto, folder: Path, where: tuple[str, int, int | None] | None = None) -> np.ndarray:
    """A tensor's values: where external (at ``where``, its :func:`external_info`, if known), read
    from its data file, or for a large one a read-only memory map of it (nothing read until used);
    else decoded from the graph."""
    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    location, offset, _ = where or external_info(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    shape = tuple(tensor.dims)
    count = math.prod(shape)
    # two values a byte: their bytes as stored (what a copy of them needs)
    if tensor.data_type in PACKED_4BIT:
        dtype, shape = np.dtype(np.uint8), ((count + 1) // 2,)
        count = shape[0]
    # small: read (a memory map costs more to set up than to read it)
    if count * dtype.itemsize <= READ_BYTES:
        return np.fromfile(os.path.join(folder, location), dtype=dtype, count=count, offset=offset).reshape(shape)
    return np.memmap(os.path.join(folder, location), dtype=dtype, mode="r", offset=offset,
                     shape=shape)


def _next_data(fd: int, at: int, end: int) -> tuple[int, int]:
    """The next run of written bytes of a file in [at, end), as (start, stop); (end, end) where only
    a hole is left."""
    try:
        data = os.lseek(fd, at, os.SEEK_DATA)
        return min(data, end), min(os.lseek(fd, data, os.SEEK_HOLE), end)
    except OSError as exc:
        # ENXIO: a hole to the end; else: cannot tell
        return (end, end) if exc.errno == errno.ENXIO else (at, end)


def copy_range(source, start: int, length: int, target) -> None:
    """``length`` bytes of ``source`` from ``start`` to ``target``'s position (a file opened for
    writing where it seeks: not in append mode); a hole of the source (a sparse file's unwritten
    part) stays a hole: it is skipped, not read and written as zeros. Copied by the kernel where it
    can (:func:`_copied_in_kernel`), else in chunks."""
    fd, end, base = source.fileno(), start + length, target.tell()
    # (past its end a file reads as a hole: written as one, a short file's tensor would be zeros)
    if (size := os.fstat(fd).st_size) < end:
        raise OSError(f"{source.name}: ends {end - size} bytes short of what a tensor needs")
    at = start
    while at < end:
        data, stop = _next_data(fd, at, end)
        target.seek(base + data - start)  # (writes out what the target holds buffered)
        data = _copied_in_kernel(fd, target.fileno(), data, stop, base - start)
        source.seek(data)
        target.seek(base + data - start)
        while data < stop:
            chunk = source.read(min(COPY_CHUNK, stop - data))
            if not chunk:
                raise OSError(f"{source.name}: ends {end - data} bytes short of what a tensor "
                              f"needs")
            target.write(chunk)
            data += len(chunk)
        at = stop
    target.seek(base + length)
    if os.fstat(target.fileno()).st_size < base + length:
        target.truncate(base + length)


def _copied_in_kernel(source: int, target: int, at: int, stop: int, shift: int) -> int:
    """Bytes ``at``..``stop`` of ``source`` copied to ``target`` (``shift`` bytes further on) by the
    kernel (os.copy_file_range: no pass through Python; on a file system that shares blocks, XFS or
    Btrfs, no second copy on disk), as far as it goes; where it stops (no such call here, files it
    does not serve, the source's end) the caller copies the rest. On this VM's ext4: 2.3 GB in
    0.7-0.8 s instead of 3.2-3.5 s, the source in the page cache."""
    copy = getattr(os, "copy_file_range", None)
    while copy is not None and at < stop:
        try:
            copied = copy(source, target, stop - at, at, at + shift)
        except OSError:
            break
        if not copied:
            break
        at += copied
    return at


class DataWriter:
    """Appends tensors to one data file of ``folder``, each at a page boundary (opened to write where
    it seeks, not in append mode: a tensor whose bytes begin in a hole of their file is copied after
    that hole, which an append would have written where the hole was)."""

    def __init__(self, folder: Path, location: str):
        self.folder, self.location = Path(folder), location
        self.path = self.folder / location
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666), "r+b")
        self.file.seek(0, os.SEEK_END)

    def add(self, tensor: TensorProto, values: np.ndarray | None = None) -> None:
        """Move ``tensor``'s values (or ``values``) into the file; ``tensor`` becomes a reference to
        them."""
        values = numpy_helper.to_array(tensor) if values is None else values
        # little-endian, as ONNX's external data is, on every host autoprec runs on
        data = np.ascontiguousarray(values)
        offset = -(-self.file.tell() // ALIGN) * ALIGN
        self.file.write(b"\0" * (offset - self.file.tell()))
        self.file.write(memoryview(data.reshape(-1)).cast("B"))
        _set_external(tensor, self.location, offset, data.nbytes)

    def copy(self, tensor: TensorProto, folder: Path) -> None:
        """Copy an external tensor of ``folder`` into the file in chunks (never all of it in
        memory)."""
        location, start, length = external_info(tensor)
        length = nbytes(tensor) if length is None else length
        offset = -(-self.file.tell() // ALIGN) * ALIGN
        self.file.write(b"\0" * (offset - self.file.tell()))
        with open(Path(folder) / location, "rb") as source:
            copy_range(source, start, length, self.file)
        _set_external(tensor, self.location, offset, length)

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


def externalize(model: onnx.ModelProto, folder: Path, location: str) -> int:
    """Move every inline tensor of ``model`` over ``INLINE_BYTES`` into ``folder/location``
    (appended); returns how many. The graph keeps only references: small enough to copy, write and
    send."""
    large = [t for t in tensors(model.graph)
             if not is_external(t) and t.data_type != TensorProto.STRING and nbytes(t) > INLINE_BYTES]
    if not large:
        return 0
    writer = DataWriter(folder, location)
    with atomic.naming(folder / location):
        try:
            for tensor in large:
                writer.add(tensor)
        finally:
            writer.close()
    return len(large)


def check_external_data(model: onnx.ModelProto, folder: Path, what: str) -> None:
    """Every external tensor's file is a plain file under ``folder`` (no absolute path, no way out
    of it, no link) holding its bytes where its fields say; raises ValueError naming the first that
    does not and the fix (``what``: the model, for the message)."""
    root = Path(folder).resolve()
    sizes: dict[str, int] = {}
    resave = "re-save the model with onnx.save_model(model, path, save_as_external_data=True)"
    for tensor in (t for t in tensors(model.graph) if is_external(t)):
        try:
            location, offset, length = external_info(tensor)
        except (KeyError, ValueError):
            fields = {e.key: e.value for e in tensor.external_data}
            raise ValueError(
                f"{what}: tensor {tensor.name!r} has unreadable external-data fields {fields}; "
                f"{resave}"
            ) from None
        if offset < 0 or (length is not None and length != nbytes(tensor)):
            raise ValueError(f"{what}: tensor {tensor.name!r} says offset {offset}, length "
                             f"{length} in {location!r}, but its type and dims take "
                             f"{nbytes(tensor)} bytes; {resave}")
        given = root / location
        if given.is_symlink():
            raise ValueError(f"{what}: tensor {tensor.name!r} keeps its values in {location!r}, a "
                             "symbolic link (onnx refuses external data through links): copy the "
                             "file itself beside the model")
        path = given.resolve()
        if Path(location).is_absolute() or root not in path.parents:
            raise ValueError(f"{what}: tensor {tensor.name!r} names external data {location!r} "
                             "outside its folder; keep the data files next to the model and name "
                             "them relative to it")
        if location not in sizes:
            sizes[location] = path.stat().st_size if path.is_file() else -1
        if sizes[location] < 0:
            raise ValueError(f"{what}: tensor {tensor.name!r} keeps its values in {location!r}, "
                             "which is not beside it; keep the data files next to the model")
        if offset + (nbytes(tensor) if length is None else length) > sizes[location]:
            raise ValueError(f"{what}: {location!r} ends before tensor {tensor.name!r} does "
                             "(truncated?); copy or download the data file again")


# the given model's data files, copied under their own names: none takes a name the folder uses
GIVEN = "given"


def copy_external_data(model: onnx.ModelProto, source: Path, folder: Path) -> int:
    """Copy ``model``'s external data files (relative to ``source``) into ``folder``/``GIVEN`` under
    their own names, and point ``model``'s tensors there. Returns the bytes copied. (A hard link
    would spare the copy, but raises the user's file's link count, and onnx then refuses to load it:
    "a potential hardlink attack".)"""
    copied = 0
    external = [t for t in tensors(model.graph) if is_external(t)]
    for location in sorted({external_info(t)[0] for t in external}):
        target = Path(folder) / GIVEN / location
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic.naming(target), open(Path(source) / location, "rb") as given:
            with open(target, "wb") as copy:
                copy_range(given, 0, os.fstat(given.fileno()).st_size, copy)
        copied += target.stat().st_size
    for tensor in external:
        location, offset, length = external_info(tensor)
        _set_external(tensor, f"{GIVEN}/{location}", offset,
                      nbytes(tensor) if length is None else length)
    return copied


def _write_whole(path: Path, data: bytes | memoryview) -> None:
    """``data`` at ``path`` whole or not at all: written under a temporary name beside it (a new one
    each time: several may make the same file at once), renamed when done, removed when the write
    fails."""
    fd, tmp = atomic.temporary(path)
    try:
        with atomic.naming(path), os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class StoredModel:
    """A graph (``proto``) whose external tensors live in ``folder``: what lowering makes, engines
    load, and exports copy. Small enough to copy, send to a worker process or write per
    candidate."""

    proto: onnx.ModelProto
    folder: Path

    @property
    def graph(self) -> onnx.GraphProto:
        return self.proto.graph

    def tensor(self, name: str) -> np.ndarray:
        """An initializer's values, read-only (memory-mapped where external)."""
        return read_tensor(next(t for t in self.proto.graph.initializer if t.name == name),
                           self.folder)

    def weight_bytes(self) -> int:
        return weight_bytes(self.proto)

    def with_proto(self, proto: onnx.ModelProto) -> StoredModel:
        return StoredModel(proto, self.folder)

    @contextlib.contextmanager
    def file(self) -> Iterator[Path]:
        """The graph written to a file of its own in ``folder`` (where its external data resolves),
        for an engine to load from; removed afterwards (engines read it while they load)."""
        with _write_lock:
            name = f".candidate-{os.getpid()}-{next(_written)}.onnx"
        path = Path(self.folder) / name
        try:
            with atomic.naming(path):
                path.write_bytes(self.proto.SerializeToString())  # (a full disk: removed below)
            yield path
        finally:
            path.unlink(missing_ok=True)

    def derived(self, name: str, make: Callable[[], np.ndarray], size: int) -> TensorProto:
        """A tensor lowering makes from the weights (an INT8 or FP16 copy) of ``size`` bytes, named
        ``name``: inline up to ``DERIVED_INLINE_BYTES`` (made once per process), else written once
        to the folder's ``derived/`` and referenced from then on by every process that lowers this
        model (its content is fixed by its name: made from the prepared weights alone)."""
        known = _derived.get((str(self.folder), name))
        if known is not None and (
            not is_external(known) or os.path.isfile(os.path.join(self.folder, known.external_data[0].value))
        ):
            # (checked still there: a folder removed and made again within one process)
            return known
        if size <= DERIVED_INLINE_BYTES:
            return _derived.setdefault(
                (str(self.folder), name),
                numpy_helper.from_array(np.ascontiguousarray(make()), name)
            )
        key = hashlib.sha256(name.encode()).hexdigest()[:24]
        location = f"{DERIVED}/{key}.bin"
        path = Path(self.folder) / location
        meta = path.with_suffix(".npy-header")
        if not (path.is_file() and meta.is_file()):
            values = np.ascontiguousarray(make())
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_whole(path, memoryview(values.reshape(-1)).cast("B"))
            # last: whole
            _write_whole(meta, f"{values.dtype.name}|{','.join(map(str, values.shape))}".encode())
        # made from what the files say, never holding the values: a protobuf keeps the bytes of a
        # field it once held until the whole message goes, and these are kept for the process's life
        dtype_name, shape_text = meta.read_text().split("|")
        shape = tuple(int(d) for d in shape_text.split(",") if d)
        tensor = TensorProto(name=name,
                             data_type=helper.np_dtype_to_tensor_dtype(np.dtype(dtype_name)),
                             dims=shape)
        _set_external(tensor, location, 0, path.stat().st_size)
        return _derived.setdefault((str(self.folder), name), tensor)


def inlined(model: StoredModel) -> onnx.ModelProto:
    """A copy of the graph with every external tensor read back into it (for a small model's
    one-file form)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    for tensor in tensors(proto.graph):
        if is_external(tensor):
            values = np.array(read_tensor(tensor, model.folder))
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = values.tobytes()
    return proto


def save_models(
    models: Mapping[Path, StoredModel], data: str | None = None, external: bool | None = None
) -> list[Path]:
    """Write each model to its path, self-contained: its external tensors copied into one data file
    named ``data`` (default ``<first model's name>.data``) beside them, shared by all (a weight they
    have in common is written once), or read back into each .onnx. ``external`` None: external data
    where the models' weights reach ``EXTERNAL_EXPORT_BYTES``. Each file is written whole or not at
    all."""
    paths = list(models)
    folder = paths[0].parent
    data = data or f"{paths[0].name}.data"
    if external is None:
        external = sum(m.weight_bytes() for m in models.values()) >= EXTERNAL_EXPORT_BYTES
    if not external:
        # an earlier save's, of a plan whose weights were larger
        (folder / data).unlink(missing_ok=True)
        return [atomic.write_bytes(path, inlined(model).SerializeToString()) for path, model in models.items()]
    protos = _gathered(models, folder, data)
    return [atomic.write_bytes(path, proto.SerializeToString()) for path, proto in protos.items()]


def _gathered(models: Mapping[Path, StoredModel], folder: Path, data: str) -> dict[Path, onnx.ModelProto]:
    """Copies of the models' graphs whose every tensor over ``INLINE_BYTES`` lies in
    ``folder/data``, written (to a temporary name, renamed when whole) with each tensor the models
    share copied once."""
    protos: dict[Path, onnx.ModelProto] = {}
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = atomic.temporary(folder / data)
    os.close(fd)
    writer = DataWriter(folder, tmp.name)
    try:
        with atomic.naming(folder / data, tmp):
            _gather(models, protos, writer, data)
            writer.close()
        os.replace(tmp, folder / data)
    except BaseException:
        with contextlib.suppress(OSError):  # (its buffer's flush fails again on a full disk)
            writer.file.close()
        tmp.unlink(missing_ok=True)
        raise
    return protos


def _gather(models: Mapping[Path, StoredModel], protos: dict[Path, onnx.ModelProto],
            writer: DataWriter, data: str) -> None:
    """:func:`_gathered`'s copies, each tensor written once through ``writer``."""
    # (folder, location, offset) -> its place in data
    copied: dict[tuple[str, str, int], tuple[int, int]] = {}
    for path, model in models.items():
        protos[path] = proto = onnx.ModelProto()
        proto.CopyFrom(model.proto)
        for tensor in tensors(proto.graph):
            if tensor.data_type == TensorProto.STRING or (
                not is_external(tensor) and nbytes(tensor) <= INLINE_BYTES
            ):
                continue
            if not is_external(tensor):
                writer.add(tensor)  # a large tensor held in the graph itself
            else:
                source = (str(model.folder), *external_info(tensor)[:2])
                if source not in copied:
                    writer.copy(tensor, model.folder)
                    copied[source] = external_info(tensor)[1:]
                _set_external(tensor, writer.location, *copied[source])
            _set_external(tensor, data, *external_info(tensor)[1:])


def load(path: Path) -> StoredModel:
    """An ONNX file as a stored model (its external data stays where it is, beside the file)."""
    return StoredModel(onnx.load(str(path), load_external_data=False), Path(path).parent)
