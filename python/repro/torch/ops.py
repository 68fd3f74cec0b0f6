"""The capture ladder's `ops` level: the output of every aten op a step runs, forward and
backward, recorded from inside a `TorchDispatchMode` (`OpOutputs`). Autograd runs the backward
pass's ops under the mode too, each while the engine evaluates the autograd node of the forward
op it differentiates; the mode notes on that node (its `metadata`) the module path and source
line of the forward op, so a backward op is named after the module whose forward it
differentiates."""

from __future__ import annotations

import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .sources import op_call_site
from .tensors import NUMBER_DTYPES

# Ops whose outputs hold memory they never wrote, whatever was there before: not recorded (their
# hashes would differ between identical runs).
UNINITIALIZED = frozenset(("aten.empty", "aten.empty_like", "aten.empty_strided", "aten.empty_permuted",
                           "aten.new_empty", "aten.new_empty_strided", "aten.resize_", "aten.resize_as_"))

# The key of an autograd node's `metadata` that holds the module path and source line of the
# forward op that made the node.
NODE_KEY = "repro_torch"

# The module path that names a backward op run by an autograd node no forward op recorded here
# made (the gradients' accumulation into `.grad`, a node made before the step's ops were recorded).
UNKNOWN_MODULE = "backward"

# The `__torch_dispatch__` of a tensor that is PyTorch's own (a plain tensor, a parameter, a
# buffer), not a subclass's that holds its values otherwise (DTensor, FakeTensor).
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__

# The engine's id of the graph task running now; -1 outside a backward pass.
_graph_task_id = torch._C._current_graph_task_id
# The autograd node the engine is evaluating now; None outside one.
_current_node = torch._C._current_autograd_node


class OpOutputs(TorchDispatchMode):
    """Records, while entered, the output of every op the program runs as the next graph node of
    a step (`StepRecorder.op_output`), named `{module path}/{op}#{k}` (`{op}#{k}` at the root
    module): the dotted path of the innermost module whose forward runs (`modules`, which the
    `ModelRecorder` keeps), or for a backward op that of the module whose forward op made the
    autograd node running it (`UNKNOWN_MODULE` where none did); the op's overload packet
    (`aten.convolution`), with `.i` after it for the `i`th tensor of an op returning several;
    and `k`, the op's index among the ops of that module path in the step, forward and backward,
    recorded or not. Its `source` is the innermost line of the program's own code on the stack
    (`sources.op_call_site`: in a module of torch's, the line that called the module; in one of
    the program's, the op's own line), for a backward op its forward op's. Its phase is
    `backward` inside autograd's backward pass, `update` once the step has recorded its
    gradients (`updating`), else `forward`. Only floating-point and integer tensors of PyTorch's
    own types are recorded (parameters included; not a subclass's such as DTensor's); not the
    views an op returns of its inputs (their values are their base's, recorded by the op that
    wrote it), nor the outputs of ops that leave memory unwritten (`UNINITIALIZED`), nor those of
    the ops this package runs itself (copying a tensor to record it)."""

    def __init__(self, step):
        super().__init__()
        self._step = step
        # The module paths whose forward runs, innermost last.
        self.modules: list[str] = []
        # Whether the step has recorded its gradients: the ops from then on are the update's.
        self.updating = False
        self._counts: dict[str, int] = {}
        # The forward ops' outputs whose autograd nodes are not noted yet (autograd sets a
        # tensor's node after the op returns), as weak references with their notes.
        self._made: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._made:
            self._note_nodes()
        ours, source = op_call_site(sys._getframe(1))
        if ours:
            return out
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        if _graph_task_id() != -1:
            phase = "backward"
            node = _current_node()
            path, source = (node.metadata.get(NODE_KEY) if node is not None else None) or (UNKNOWN_MODULE, None)
        else:
            phase = "update" if self.updating else "forward"
            path = self.modules[-1] if self.modules else ""
            self._made += [(weakref.ref(t), (path, source)) for t in outputs if isinstance(t, torch.Tensor)]
        k = self._counts.get(path, 0)
        self._counts[path] = k + 1
        op = str(func.overloadpacket)
        if op in UNINITIALIZED:
            return out
        several = isinstance(out, (tuple, list))
        prefix = f"{path}/{op}" if path else op
        for i, (t, alias) in enumerate(zip(outputs, _aliases(func, len(outputs), isinstance(out, list)))):
            if (alias != VIEW and isinstance(t, torch.Tensor) and type(t).__torch_dispatch__ is _PLAIN_DISPATCH
                    and t.dtype in NUMBER_DTYPES and t.layout == torch.strided and t.device.type != "meta"):
                name = f"{prefix}.{i}#{k}" if several else f"{prefix}#{k}"
                self._step.op_output(name, t, phase, source, written=alias == WRITTEN)
        return out

    def _note_nodes(self) -> None:
        """Notes on each autograd node the forward ops made since the last op the module path and
        source of the op that made it (a node noted already keeps its note)."""
        for ref, note in self._made:
            t = ref()
            node = t.grad_fn if t is not None else None
            if node is not None and NODE_KEY not in node.metadata:
                node.metadata[NODE_KEY] = note
        self._made.clear()


# What an op's output is to its inputs (`_aliases`): one of them, written in place (`add_`, an
# `out=` argument), or a view of one; None: new memory.
WRITTEN, VIEW = "written", "view"


def _aliases(func, n: int, listed: bool) -> tuple:
    """For each of the `n` tensors an op returns, what it is to the op's inputs (`WRITTEN`,
    `VIEW` or None), as its schema's returns say; `listed`: the op returns one list of them."""
    aliases = _ALIASES.get(func)
    if aliases is None:
        aliases = _ALIASES[func] = tuple(None if r.alias_info is None else WRITTEN if r.alias_info.is_write else VIEW
                                         for r in func._schema.returns)
    if listed:
        return aliases[:1] * n if aliases else (None,) * n
    return aliases if len(aliases) == n else (None,) * n


# Each op's `_aliases`, found once.
_ALIASES: dict = {}
