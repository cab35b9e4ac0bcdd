"""An ONNX graph read as data: who produces and who consumes each tensor, and the value of every
tensor computed from constants alone (the exporter's folded initializers, or a subgraph it left
unfolded), so importers can follow a policy's structure instead of trusting initializer names.

Nothing here runs the graph: constant folding covers a few elementwise and shape ops on
initializers with numpy, and anything else is "not a constant".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

FOLDABLE: dict[str, Callable[..., Any]] = {
    "Identity": lambda x: x,
    "Sqrt": np.sqrt,
    "Exp": np.exp,
    "Neg": np.negative,
    "Reciprocal": np.reciprocal,
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
}


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]


class GraphError(ValueError):
    """The graph is not one this importer understands (one line, naming what it met)."""


def _array(tensor: Any) -> np.ndarray:
    """A tensor of the file as numpy, its declared size checked against the data it holds before
    anything is allocated (dims of [2^20, 2^20] over 16 bytes would otherwise be believed)."""
    from onnx import TensorProto, helper, numpy_helper

    name = tensor.name or "a constant"
    if tensor.data_location == TensorProto.EXTERNAL:
        raise GraphError(f"{name} keeps its data in another file; relay reads the one file it is given")
    if any(d < 0 for d in tensor.dims):
        raise GraphError(f"{name} has a negative dimension {list(tensor.dims)}")
    count = int(np.prod([int(d) for d in tensor.dims], dtype=object))
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        raise GraphError(f"{name} has a data type relay does not read ({tensor.data_type})") from None
    fields = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")
    held = (
        len(tensor.raw_data) // itemsize if tensor.raw_data else max(len(getattr(tensor, f)) for f in fields)
    )
    if held != count:
        raise GraphError(f"{name} declares {list(tensor.dims)} ({count} values) but holds {held}")
    return numpy_helper.to_array(tensor)


class OnnxGraph:
    """Producers, consumers and constants of an `onnx.ModelProto`'s main graph."""

    def __init__(self, proto: Any) -> None:
        from onnx import helper

        graph = proto.graph
        self.consts: dict[str, np.ndarray] = {i.name: _array(i) for i in graph.initializer}
        self.producer: dict[str, Node] = {}
        self.consumers: dict[str, list[Node]] = {}
        for raw in graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in raw.attribute}
            node = Node(raw.op_type, tuple(raw.input), tuple(raw.output), attrs)
            if node.op == "Constant" and "value" in attrs:
                self.consts[node.outputs[0]] = _array(attrs["value"])
                continue
            for out in node.outputs:
                self.producer[out] = node
            for name in node.inputs:
                self.consumers.setdefault(name, []).append(node)
        self.inputs = [i.name for i in graph.input if i.name not in self.consts]
        self.outputs = [o.name for o in graph.output]
        self.input_shapes = {
            i.name: tuple(d.dim_value if d.dim_value > 0 else None for d in i.type.tensor_type.shape.dim)
            for i in graph.input
        }
        self._folded: dict[str, np.ndarray | None] = {}

    def const(self, name: str) -> np.ndarray | None:
        """The tensor's value when it depends on constants alone, else None."""
        if name in self.consts:
            return self.consts[name]
        if name not in self._folded:
            self._folded[name] = None  # a cycle (never in a valid graph) folds to "not constant"
            self._folded[name] = self._fold(name)
        return self._folded[name]

    def _fold(self, name: str) -> np.ndarray | None:
        node = self.producer.get(name)
        if node is None:
            return None
        maybe = [self.const(i) for i in node.inputs if i]
        args = [a for a in maybe if a is not None]
        if len(args) != len(maybe):
            return None
        if node.op in FOLDABLE:
            with np.errstate(all="ignore"):
                return np.asarray(FOLDABLE[node.op](*args))
        if node.op == "Cast":
            return args[0].astype(np.float32) if node.attrs.get("to") == 1 else args[0]
        if node.op in ("Reshape", "Unsqueeze", "Squeeze"):
            return args[0]  # elementwise use only: broadcasting settles the shape
        return None

    def node_of(self, name: str, what: str) -> Node:
        node = self.producer.get(name)
        if node is None:
            raise GraphError(f"{what}: {name!r} is not computed by any node")
        return node

    def split(self, node: Node) -> tuple[str, np.ndarray] | None:
        """For a binary node with one constant input: (the other input, the constant)."""
        if len(node.inputs) != 2:
            return None
        a, b = node.inputs
        ca, cb = self.const(a), self.const(b)
        if cb is not None and ca is None:
            return a, cb
        if ca is not None and cb is None:
            return b, ca
        return None

    def depends_on(self, name: str, source: str) -> bool:
        """Whether tensor `name` is computed (directly or not) from tensor `source`."""
        seen, stack = set(), [name]
        while stack:
            t = stack.pop()
            if t == source:
                return True
            if t in seen or t not in self.producer:
                continue
            seen.add(t)
            stack.extend(i for i in self.producer[t].inputs if i)
        return False

    def upstream_ops(self, name: str) -> list[Node]:
        """Every node `name` depends on (each once)."""
        seen: dict[int, Node] = {}
        stack = [name]
        visited: set[str] = set()
        while stack:
            t = stack.pop()
            if t in visited or t not in self.producer:
                continue
            visited.add(t)
            node = self.producer[t]
            seen[id(node)] = node
            stack.extend(i for i in node.inputs if i)
        return list(seen.values())
