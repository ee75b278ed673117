"""Stand-ins for AReaL's ``MFCDef`` and ``SequenceSample`` (``realhf/api/core``), with
AReaL's semantics for the parts a buffer touches, for code that does not install AReaL.
AReaL's own classes work wherever these do.

``SequenceSample`` follows ``data_api.py``: ``keys`` (a set), ``ids`` (coerced to str,
unique), ``seqlens[key]`` (one list of sequence lengths per piece), ``trailing_shapes``,
``dtypes``, ``data`` (``None`` for metadata only, as AReaL's master stores them) and
``metadata`` (lists, one entry per piece). ``gather`` concatenates in list order over the
requested keys (``KeyError`` if a sample lacks one), ``unpack`` and ``split_with_spec``
cut it into pieces (AReaL's ``split_with_lengths``, which packs micro-batches by token
count, is not among them), and ``update_`` merges another sample's keys into it (the other's
values win), requiring equal ids.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional, Sequence, Set, Tuple

import numpy as np

from .._native import gather_samples as _gather_samples


@dataclass(eq=False)
class MFCDef:
    """A model function call: what the buffer reads of AReaL's ``MFCDef`` (its name, how
    many entries a call takes, its input and output keys), plus the graph relations that
    :func:`build_graph` sets."""

    name: str
    n_seqs: int
    input_keys: Tuple[str, ...] = ()
    output_keys: Tuple[str, ...] = ()
    parents: List["MFCDef"] = field(default_factory=list, repr=False)
    children: List["MFCDef"] = field(default_factory=list, repr=False)

    def __post_init__(self):
        for field_name in ("input_keys", "output_keys"):
            keys = getattr(self, field_name)
            # A str is a sequence of its letters: ("packed_prompts") made 14 one-letter
            # keys, and every get waited for ever.
            if isinstance(keys, (str, bytes)) or not all(isinstance(k, str) for k in keys):
                raise ValueError(
                    f"MFCDef {self.name!r}: {field_name} must be a sequence of str keys, not {keys!r} "
                    "(one key is a tuple of one: ('packed_prompts',))"
                )
            setattr(self, field_name, tuple(keys))

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def is_src(self) -> bool:
        return not self.parents

    @property
    def is_dst(self) -> bool:
        return not self.children

    def all_successors(self) -> List["MFCDef"]:
        """Every MFC downstream, depth first in preorder (as AReaL's DFS)."""
        seen, out, stack = {self.name}, [], list(reversed(self.children))
        while stack:
            node = stack.pop()
            if node.name in seen:
                continue
            seen.add(node.name)
            out.append(node)
            stack.extend(reversed(node.children))
        return out


def build_graph(nodes: Sequence[MFCDef]) -> Sequence[MFCDef]:
    """AReaL's ``build_graph``: an edge from the MFC producing a key to every MFC reading
    it (the later producer of a key wins); duplicate names raise ``ValueError``. Sets
    ``parents`` and ``children`` on the nodes and returns them."""
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate MFC names: {names}")
    producers: Dict[str, MFCDef] = {}
    for node in nodes:
        node.parents, node.children = [], []
        for key in node.output_keys:
            producers[key] = node
    for node in nodes:
        for key in node.input_keys:
            src = producers.get(key)
            if src is not None and src is not node and src not in node.parents:
                node.parents.append(src)
                src.children.append(node)
    return nodes


# Fields in slots, not in a per-object dict: a buffer reads a few fields of many samples, and
# a slot read touches the object's own memory only.
@dataclass(eq=False, slots=True)
class SequenceSample:
    """AReaL's ``SequenceSample`` (see the module docs)."""

    keys: Set[str]
    ids: List[Hashable]
    seqlens: Dict[str, List[List[int]]]
    trailing_shapes: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    dtypes: Dict[str, Any] = field(default_factory=dict)
    data: Optional[Dict[str, Any]] = None
    metadata: Dict[str, List[Any]] = field(default_factory=dict)

    def __post_init__(self):
        keys = list(self.keys)
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate keys {keys}")
        self.keys = set(keys)
        self.ids = [str(i) for i in self.ids]
        if len(set(self.ids)) != len(self.ids):
            raise ValueError(f"ids are not unique: {self.ids}")
        for k in self.keys:
            self.trailing_shapes.setdefault(k, ())
            self.dtypes.setdefault(k, None)
        for name, d in (("seqlens", self.seqlens), ("trailing_shapes", self.trailing_shapes), ("dtypes", self.dtypes)):
            if set(d) != self.keys:
                raise ValueError(f"keys of {name} {sorted(d)} differ from keys {sorted(self.keys)}")
        if self.data is not None and set(self.data) != self.keys:
            raise ValueError(f"keys of data {sorted(self.data)} differ from keys {sorted(self.keys)}")
        for k, lens in self.seqlens.items():
            if len(lens) != len(self.ids):
                raise ValueError(f"seqlens[{k!r}] has {len(lens)} entries for {len(self.ids)} ids")
        # One entry per piece: a list of another length was taken, and gathers then
        # misaligned it (the native and the Python gather disagreed).
        for k, v in (self.metadata or {}).items():
            if not isinstance(v, (list, tuple)) or len(v) != len(self.ids):
                n = len(v) if isinstance(v, (list, tuple)) else type(v).__name__
                raise ValueError(f"metadata[{k!r}] must be a list of {len(self.ids)} entries (one per id), not {n}")

    @property
    def bs(self) -> int:
        return len(self.ids)

    @classmethod
    def gather(cls, samples: Sequence["SequenceSample"], keys: Optional[Sequence[str]] = None) -> "SequenceSample":
        """One sample holding ``samples`` in order, over ``keys`` (the first sample's by
        default); ``KeyError`` when a sample lacks one of them."""
        if not samples:
            raise ValueError("gather of no samples")
        keys = list(samples[0].keys if keys is None else keys)
        # Metadata-only samples (what a buffer holds) in one native pass; the same result
        # as the code below, which handles the rest.
        fast = _gather_samples(cls, samples if isinstance(samples, list) else list(samples), keys)
        return fast if fast is not None else cls._gather(samples, keys)

    @classmethod
    def _gather(cls, samples: Sequence["SequenceSample"], keys: List[str]) -> "SequenceSample":
        """``gather`` in Python: the reference the native pass is tested against, and the
        path for samples carrying data."""
        wanted = set(keys)
        for s in samples:
            if not wanted.issubset(s.keys):
                missing = [k for k in keys if k not in s.keys]
                raise KeyError(f"sample {list(s.ids)} has no key(s) {missing}")
        first = samples[0]
        data = None
        # Data only when every sample holds it for every key: an amend can add keys
        # without data (or data without the put's), and a KeyError here, after the read
        # that freed the slots, lost the samples. AReaL's master worker stores none.
        if all(s.data is not None and all(k in s.data for k in keys) for s in samples):
            data = {k: _concat([s.data[k] for s in samples]) for k in keys}
        # Aligned by position: a sample without a metadata key gets None for each of its
        # pieces. Extending alone moved the next sample's values onto it (AReaL raises a
        # KeyError instead; here the read that freed the slots has already happened).
        metadata: Dict[str, List[Any]] = {}
        n = 0
        for s in samples:
            for mk, mv in (s.metadata or {}).items():
                metadata.setdefault(mk, [None] * n).extend(mv)
            n += len(s.ids)
            for column in metadata.values():
                if len(column) < n:
                    column.extend([None] * (n - len(column)))
        out = cls.__new__(cls)
        out.keys = wanted
        out.ids = [i for s in samples for i in s.ids]
        seqlens = [s.seqlens for s in samples]
        out.seqlens = {k: [lens for sl in seqlens for lens in sl[k]] for k in keys}
        out.trailing_shapes = {k: first.trailing_shapes.get(k, ()) for k in keys}
        out.dtypes = {k: first.dtypes.get(k) for k in keys}
        out.data = data
        out.metadata = metadata
        return out

    def split_with_spec(self, spec: Any) -> List["SequenceSample"]:
        """AReaL's ``split_with_spec``: one sample per ``(start, end)`` of
        ``spec.partitions`` (AReaL's ``SequenceSplitSpec``; one made from ``sizes`` has
        them), in order, covering every piece once. A spec with only ``sizes``, or a plain
        list of sizes, is taken too."""
        partitions = getattr(spec, "partitions", None)
        if partitions is None:
            sizes = list(getattr(spec, "sizes", None) or spec)
            bounds = np.cumsum([0] + sizes).tolist()
            partitions = list(zip(bounds[:-1], bounds[1:]))
        partitions = [(int(a), int(b)) for a, b in partitions]
        end = 0
        for a, b in partitions:
            if a != end or b <= a:
                break
            end = b
        else:
            if partitions and end == self.bs:
                return [self._slice(a, b) for a, b in partitions]
        raise ValueError(f"partitions {partitions} do not cover the {self.bs} pieces in order")

    def unpack(self) -> List["SequenceSample"]:
        """One sample per piece."""
        return self.split_with_spec([1] * self.bs)

    def _slice(self, lo: int, hi: int) -> "SequenceSample":
        data = None
        if self.data is not None:
            data = {}
            for k, v in self.data.items():
                if v is None:
                    data[k] = None
                    continue
                tokens = [sum(lens) for lens in self.seqlens[k]]
                a, b = sum(tokens[:lo]), sum(tokens[:hi])
                data[k] = v[a:b]
        out = type(self).__new__(type(self))
        out.keys = set(self.keys)
        out.ids = self.ids[lo:hi]
        out.seqlens = {k: v[lo:hi] for k, v in self.seqlens.items()}
        out.trailing_shapes = dict(self.trailing_shapes)
        out.dtypes = dict(self.dtypes)
        out.data = data
        out.metadata = {k: v[lo:hi] for k, v in self.metadata.items()}
        return out

    def update_(self, other: Any) -> None:
        """Merges ``other`` in: its keys are added, its values win for keys both have; the
        ids must be equal (``ValueError`` otherwise, with nothing changed)."""
        if other.ids != self.ids and [str(i) for i in other.ids] != [str(i) for i in self.ids]:
            raise ValueError(f"ids {list(other.ids)} differ from {list(self.ids)}")
        self.keys = self.keys | set(other.keys)
        if type(other) is type(self):
            # Every field is there (the common case, and the fast one).
            self.trailing_shapes.update(other.trailing_shapes)
            self.dtypes.update(other.dtypes)
            if other.metadata:
                self.metadata.update(other.metadata)
        else:
            self.trailing_shapes.update(getattr(other, "trailing_shapes", {}))
            self.dtypes.update(getattr(other, "dtypes", {}))
            self.metadata.update(getattr(other, "metadata", {}))
        self.seqlens.update(other.seqlens)
        other_data = getattr(other, "data", None)
        if other_data is not None:
            if self.data is None:
                self.data = {}
            self.data.update(other_data)


def _concat(values: List[Any]) -> Any:
    if any(v is None for v in values):
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values[0], torch.Tensor):
        return torch.cat(values)
    return np.concatenate([np.asarray(v) for v in values])


def gather(samples: Sequence[Any], keys: Sequence[str]) -> Any:
    """``type(samples[0]).gather(samples, keys=keys)`` (AReaL's own class when given its
    samples), or this module's for samples of a class without one."""
    if not samples:
        raise ValueError("gather of no samples")
    own = getattr(type(samples[0]), "gather", None)
    if own is not None:
        return own(list(samples), keys=list(keys))
    return SequenceSample.gather(samples, keys=keys)
