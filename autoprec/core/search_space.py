"""The search space: which ops are precision units, what they may run in, what is pinned."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Collection

from autoprec.core import atomic, untrusted
from autoprec.core.errors import SearchSpaceError
from autoprec.core.plan import Precision

SPACE_BYTES = 16 << 20  # the most a search-space file may hold (the bundled one: 2 KB)
# Ops whose FP16 result is their FP32 result rounded (no long reduction, no range change): they run
# in the precision of their neighbours where those agree (see autoprec.lower.cast). Erf is bounded
# with a bounded slope (the GELU that TorchScript exports as Div, Erf, Add, Mul, Mul). Softmax,
# normalisations, reductions, exp/log/pow are not among them: a search space lists those as
# ``sensitive``.
NEUTRAL_OPS = frozenset({
    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
    "Expand",
    "Tile", "Identity", "Pad", "DepthToSpace", "SpaceToDepth", "Resize", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Max", "Min",
    "Relu",
    "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
    "Softplus", "Gelu",
    "Where", "Erf",
})


INT4_BLOCK_SIZE = 32
EMBEDDING_PRECISIONS = frozenset({Precision.INT4, Precision.FP32})


@dataclass(frozen=True)
class SearchSpace:
    units: dict[str, tuple[Precision, ...]]
    fusable: frozenset[str]
    pinned_fp32: frozenset[str]
    overrides: tuple[tuple[str, tuple[Precision, ...]], ...] = field(default=())
    source: str = "default"
    # Numerically sensitive op types (softmax, normalisations, reductions): units of their own whose
    # safe default is FP32; uniform plans keep them FP32, and a search lowers only those its
    # sensitivity pass finds harmless and its profile finds worth it.
    sensitive: dict[str, tuple[Precision, ...]] = field(default_factory=dict)
    # Precision-neutral ops whose tensors on the calibration data leave FP16's safe range (see
    # autoprec.analysis.calibrate.out_of_range_nodes): units of their own like sensitive ones, FP32
    # by default.
    out_of_range: tuple[Precision, ...] = ()
    # values of a weight's column sharing one scale in an INT4 unit (autoprec.lower.int4)
    int4_block_size: int = INT4_BLOCK_SIZE
    # precisions for an embedding, a Gather of a constant 2-D table's rows (int4, fp32): a unit of its
    # own only where it may take INT4 (else precision-neutral, as any Gather)
    embeddings: tuple[Precision, ...] = ()

    def allowed(self, node_name: str, op_type: str) -> tuple[Precision, ...]:
        """Precisions a unit may take: its op type's (for a neutral op, a unit only for its range on
        the data: ``out_of_range``), narrowed by the last matching override."""
        if op_type in self.pinned_fp32:
            return (Precision.FP32,)
        return self._overridden(node_name, self.units.get(op_type) or self.sensitive.get(op_type) or self.out_of_range)

    def embedding_allowed(self, node_name: str) -> tuple[Precision, ...]:
        """Precisions an embedding may take: INT4 and FP32 of ``embeddings``, narrowed by the last
        matching override (FP32 where it names neither); () where the space gives embeddings no INT4
        (INT4 not searched): then it is no unit."""
        if Precision.INT4 not in self.embeddings:
            return ()
        allowed = self._overridden(node_name, self.embeddings)
        return tuple(p for p in allowed if p in EMBEDDING_PRECISIONS) or (Precision.FP32,)

    def _overridden(self, node_name: str, allowed: tuple[Precision, ...]) -> tuple[Precision, ...]:
        """``allowed``, or the precisions of the last override whose pattern matches ``node_name``."""
        for pattern, precisions in self.overrides:
            if fnmatch.fnmatchcase(node_name, pattern):
                allowed = precisions
        return allowed

    def restricted(self, keep: Collection[Precision]) -> SearchSpace:
        """Only the precisions in ``keep`` (FP32 always stays): what an engine runs fast, or what
        was asked for."""

        def narrowed(precisions: tuple[Precision, ...]) -> tuple[Precision, ...]:
            return tuple(p for p in precisions if p in keep or p is Precision.FP32) or (Precision.FP32,)

        units = {op: narrowed(p) for op, p in self.units.items()}
        overrides = tuple((pattern, narrowed(p)) for pattern, p in self.overrides)
        sensitive = {op: narrowed(p) for op, p in self.sensitive.items()}
        out_of_range = narrowed(self.out_of_range) if self.out_of_range else ()
        embeddings = narrowed(self.embeddings) if self.embeddings else ()
        return replace(self, units=units, overrides=overrides, sensitive=sensitive,
                       out_of_range=out_of_range, embeddings=embeddings)

    def without(self, precision: Precision, op_types: Collection[str]) -> SearchSpace:
        """Units of ``op_types`` no longer take ``precision`` (an engine without a kernel for
        it)."""
        units = {op: tuple(p for p in ps if p is not precision or op not in op_types) for op, ps in self.units.items()}
        return replace(self, units=units)

    def with_pinned(self, op_types: Collection[str]) -> SearchSpace:
        """``op_types`` pinned to FP32 (what an engine has no reduced-precision kernels for)."""
        return replace(self, pinned_fp32=self.pinned_fp32 | frozenset(op_types))

    def with_overrides(self, overrides: list[str]) -> SearchSpace:
        parsed = tuple(_parse_override(text) for text in overrides)
        return replace(self, overrides=self.overrides + parsed)

    def to_json(self) -> dict:
        """Everything that decides the units and their precisions (overrides included), so a result
        can re-create its analysis without the YAML file, and a study can refuse a search with
        another space."""
        return {
            "source": self.source,
            "units": {op: [p.value for p in precisions] for op, precisions in sorted(self.units.items())},
            "fusable": sorted(self.fusable),
            "pinned_fp32": sorted(self.pinned_fp32),
            "sensitive": {op: [p.value for p in precisions] for op, precisions in sorted(self.sensitive.items())},
            "out_of_range": [p.value for p in self.out_of_range],
            "overrides": [[pattern, [p.value for p in precisions]] for pattern, precisions in self.overrides],
            # (the default unsaid: a space recorded before the knob reads, and digests, the same)
            **({"int4_block_size": self.int4_block_size} if self.int4_block_size != INT4_BLOCK_SIZE else {}),
            # (unsaid where no embedding is a unit: a space without INT4 reads, and digests, as before)
            **({"embeddings": [p.value for p in self.embeddings]} if Precision.INT4 in self.embeddings else {}),
        }

    def digest(self) -> str:
        """Content hash of :meth:`to_json` without ``source`` (the same space read from another file
        is the same)."""
        content = {k: v for k, v in self.to_json().items() if k != "source"}
        return atomic.digest(content, sort_keys=True)

    @classmethod
    def from_json(cls, data: dict) -> SearchSpace:
        """The space a result recorded (see :meth:`to_json`); a damaged record is a
        :class:`SearchSpaceError`."""
        try:
            return cls(
                units={
                    str(op): parse_precisions(list(p), f"recorded search space, units.{op}")
                    for op, p in data["units"].items()
                },
                fusable=frozenset(map(str, data["fusable"])),
                pinned_fp32=frozenset(map(str, data["pinned_fp32"])),
                overrides=tuple(
                    (str(pattern), parse_precisions(list(p), f"recorded override {pattern}"))
                    for pattern, p in data["overrides"]
                ),
                source=str(data["source"]),
                sensitive={
                    str(op): parse_precisions(list(p), f"recorded search space, sensitive.{op}")
                    for op, p in data.get("sensitive", {}).items()
                },
                out_of_range=parse_precisions(list(data["out_of_range"]), "recorded search space, "
                                                                          "out_of_range")
                if data.get("out_of_range")
                else (),
                int4_block_size=block_size(data.get("int4_block_size", INT4_BLOCK_SIZE),
                                           "recorded search space"),
                embeddings=parse_precisions(list(data["embeddings"]), "recorded search space, embeddings")
                if data.get("embeddings") else (),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SearchSpaceError("the recorded search space cannot be read "
                                   f"({type(exc).__name__}: {exc}); rerun the search") from None


def parse_precisions(text: str | list, where: str) -> tuple[Precision, ...]:
    if not isinstance(text, (str, list, tuple)):
        raise SearchSpaceError(
            f"{where}: {text!r} is not a list of precisions; use int4, int8, fp16 and fp32, e.g. "
            "'fp16,fp32'"
        )
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        # (a precision named twice counts once: a unit's choices are a set)
        precisions = tuple(dict.fromkeys(Precision(str(p).strip().lower()) for p in items if str(p).strip()))
    except ValueError:
        raise SearchSpaceError(
            f"{where}: {items!r} is not a list of precisions; use int4, int8, fp16 and fp32, e.g. "
            "'fp16,fp32'"
        ) from None
    if not precisions:
        raise SearchSpaceError(f"{where}: no precision given; use int4, int8, fp16 and fp32, e.g. "
                               "'fp16,fp32'")
    return precisions


def _parse_override(text: str) -> tuple[str, tuple[Precision, ...]]:
    pattern, sep, precisions = text.partition("=")
    if not sep or not pattern:
        raise SearchSpaceError(
            f"--override {text!r}: expected PATTERN=PRECISIONS, e.g. --override '/head/*=fp32' "
            "or --override 'Conv_1*=fp16,fp32'"
        )
    return pattern, parse_precisions(precisions, f"--override {text!r}")


def load_search_space(path: str | Path | None = None) -> SearchSpace:
    """Read a search-space YAML; None means the bundled ``search_spaces/default.yaml``."""
    if path is None:
        # search_spaces/ is packaged as autoprec.search_spaces (a symlink in the source tree)
        text = resources.files("autoprec.search_spaces").joinpath("default.yaml").read_text()
        source = "default"
    else:
        try:
            found = untrusted.read_bytes(Path(path), "a search space", SPACE_BYTES, given=True)
            text = found.decode("utf-8")
        except OSError as exc:
            raise SearchSpaceError(f"search space {path}: cannot be read ({exc.strerror}); check "
                                   "the path") from None
        except UnicodeDecodeError:
            raise SearchSpaceError(f"search space {path}: not UTF-8 text; save the YAML file as "
                                   "UTF-8") from None
        except ValueError as exc:
            raise SearchSpaceError(f"search space {path}: {exc}; give the YAML file itself"
                                   ) from None
        source = str(path)
    try:
        raw = untrusted.parse_yaml(text) or {}
    except ValueError as exc:
        raise SearchSpaceError(f"search space {source}: not valid YAML ({exc}); fix the file") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("units"), dict) or not raw["units"]:
        raise SearchSpaceError(f"search space {source}: needs a non-empty 'units:' mapping of op "
                               "type to precisions")
    units = {
        _text(op, source, "units"): parse_precisions(p, f"search space {source}, units.{op}")
        for op, p in raw["units"].items()
    }
    sensitive = raw.get("sensitive") or {}
    if not isinstance(sensitive, dict):
        raise SearchSpaceError(f"search space {source}: 'sensitive:' must map op types to "
                               "precisions, e.g. sensitive: {Softmax: [fp16, fp32]}")
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise SearchSpaceError(f"search space {source}: 'overrides:' must map name patterns to "
                               "precisions, e.g. overrides: {'/head/*': [fp32]}")
    return SearchSpace(
        units=units,
        fusable=_op_types(raw, "fusable", source),
        pinned_fp32=_op_types(raw, "pinned_fp32", source),
        overrides=tuple(
            (_text(pattern, source, "overrides"), parse_precisions(p, f"search space {source}, "
                                                                      f"overrides.{pattern}"))
            for pattern, p in overrides.items()
        ),
        source=source,
        sensitive={
            _text(op, source, "sensitive"): parse_precisions(p, f"search space {source}, "
                                                                f"sensitive.{op}")
            for op, p in sensitive.items()
        },
        out_of_range=parse_precisions(raw["out_of_range"], f"search space {source}, out_of_range")
        if raw.get("out_of_range")
        else (),
        int4_block_size=block_size(raw.get("int4_block_size", INT4_BLOCK_SIZE), f"search space {source}"),
        embeddings=_embeddings(raw, source),
    )


def _embeddings(raw: dict, source: str) -> tuple[Precision, ...]:
    """``embeddings:``: INT4 and FP32 only (a Gather reads rows: no INT8 or FP16 kernel to choose)."""
    if not raw.get("embeddings"):
        return ()
    value = raw["embeddings"]
    if not isinstance(value, list) or not {str(v).strip().lower() for v in value} <= {p.value for p in EMBEDDING_PRECISIONS}:
        raise SearchSpaceError(f"search space {source}: embeddings: {value!r} — an embedding takes int4 or fp32 "
                               "only; write embeddings: [int4, fp32]")
    return parse_precisions(value, f"search space {source}, embeddings")


# what ONNX Runtime's MatMulNBits quantizer (MlasQuantizeBlockwise) takes; TensorRT's INT4 weights alike
INT4_BLOCK_SIZES = (16, 32, 64, 128, 256)


def block_size(value: object, where: str) -> int:
    """An INT4 block size: one of INT4_BLOCK_SIZES (512 passed as a power of two, and the lowering
    failed on it)."""
    if isinstance(value, bool) or value not in INT4_BLOCK_SIZES:
        raise SearchSpaceError(f"{where}: int4_block_size {value!r} is not a block size INT4 weights "
                               f"take; use 16, 32 (the default), 64, 128 or 256")
    return value


def _text(value: object, source: str, key: str) -> str:
    if not isinstance(value, str):
        raise SearchSpaceError(f"search space {source}: {key} has the key {value!r}, which is not "
                               "text; quote it")
    return value


def _op_types(raw: dict, key: str, source: str) -> frozenset[str]:
    """A list of op type names (``fusable:``, ``pinned_fp32:``)."""
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SearchSpaceError(
            f"search space {source}: '{key}:' must be a list of op type names, e.g. {key}: [Relu, "
            "Add]"
        )
    return frozenset(value)
