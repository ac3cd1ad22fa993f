"""Which calls may be memoized: the purity of a call, and whether a graph may differentiate its values.

A call is pure when its result depends only on its arguments and it changes nothing: no in-place
or ``out=`` write, no process-wide setting, no side effect, no functorch level pushed or popped,
and a target torch owns (an entry must keep nothing of the user's alive). A graph that may walk
the autograd graph of its values (``backward``, ``autograd.grad``, code fxprop cannot see into)
must not be handed a memoized result that requires grad, which has no autograd history.
"""
from __future__ import annotations

import operator
import sys
import types
from typing import Any

import torch
import torch.fx

from ..torch_compat import (HigherOrderOperator, OpOverload, OpOverloadPacket, dual_level_ops, pytree, schema_of,
                            set_fwd_grad_enabled_op, set_grad_enabled_op, swap_tensor_impl)

_IN_PLACE_OPERATORS = frozenset({"iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imod", "imul", "imatmul", "ior",
                                  "ipow", "irshift", "isub", "itruediv", "ixor"})
_TORCH_MODULES = ("torch", "_operator", "operator", "math", "builtins")
_IMPURE_METHODS = frozenset({"item", "tolist", "numpy", "backward", "register_hook", "retain_grad", "requires_grad_",
                             "data_ptr", "untyped_storage", "storage"})
# The same methods taken from the class, as a call_function target (``torch.Tensor.backward``).
_IMPURE_TENSOR_METHODS = frozenset(getattr(torch.Tensor, name) for name in _IMPURE_METHODS)
# Calls that change what they are given, or call what they are given (``operator.call``), with names that do not say so.
_IMPURE_CALLS = frozenset({operator.setitem, operator.delitem, setattr, delattr, set_grad_enabled_op, print,
                           getattr(torch, "_assert_async", print), *_IMPURE_TENSOR_METHODS,
                           getattr(operator, "call", print), torch.utils.swap_tensors, swap_tensor_impl,
                           torch.nn.utils.vector_to_parameters, exec, eval})
# What torch's own targets are: ops, and functions, builtins, method descriptors and classes whose
# module is torch's or python's. A callable object (``operator.methodcaller("resize_", ...)``) takes
# its class's module, whatever it calls and holds.
_PLAIN_CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.MethodDescriptorType,
                    types.WrapperDescriptorType, types.ClassMethodDescriptorType, type)
_SETTERS = ("set_", "_set_", "use_")
# What a tensor's signature holds (`fxprop.memo.signatures`), or views of it; a tensor's other
# attributes (``_version``, ``grad``, ``grad_fn``, ``_base``, ``data``) are its history or state.
_ATTRIBUTES_THE_KEY_HOLDS = frozenset({"shape", "dtype", "device", "layout", "ndim", "requires_grad", "is_leaf",
                                       "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_nested",
                                       "is_mkldnn", "T", "mT", "H", "mH", "real", "imag"})
_purity: dict[tuple[str, Any], bool] = {}  # only for torch's own targets, which live as long as torch
_several_views: dict[tuple[str, Any], bool] = {}  # the same: per target, once per process
_AUTOGRAD_PACKAGES = ("torch.autograd", "torch.func", "torch._functorch")
_STATEFUL_PACKAGES = ("torch.func", "torch._functorch", "torch._C._functorch")  # they push and pop transform levels


def _within(module: str, packages: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one (``torch.functional`` is not inside ``torch.func``)."""
    return any(module == package or module.startswith(package + ".") for package in packages)


def may_differentiate(gm: torch.fx.GraphModule) -> bool:
    """Whether running ``gm`` may walk the autograd graph of its values (``backward``,
    ``autograd.grad``, or code fxprop cannot see into). A memoized result is a fresh tensor
    with no autograd history, so such graphs must not be given one that requires grad."""
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        graph = module.graph
        if graph.find_nodes(op="call_method", target="backward", sort=False):
            return True
        if any(graph.find_nodes(op="call_function", target=target, sort=False) for target in _CALLING_BACKWARD):
            return True
        if any(node.args[1:2] == ("backward",) for node in graph.find_nodes(op="call_function", target=getattr,
                                                                             sort=False)):
            return True
        if any(node.op == "call_function" and _may_reach_autograd(node.target) for node in graph.nodes):
            return True
        called = graph.find_nodes(op="call_module", sort=False)
        if called:
            submodules = dict(module.named_modules(remove_duplicate=False))
            verdicts: dict[int, bool] = {}
            for node in called:
                found = submodules.get(str(node.target))  # a missing one: the walk reports it at its node
                if found is not None and not _only_torch_modules(found, verdicts):
                    return True  # a user's module, or a torch container holding one
    return False


# ``Tensor.backward`` as a call_function target, and ``operator.call``, which may be given it.
_CALLING_BACKWARD = (torch.Tensor.backward, *((operator.call,) if hasattr(operator, "call") else ()))


def _only_torch_modules(module: torch.nn.Module, verdicts: dict[int, bool]) -> bool:
    """Whether ``module`` and everything it holds are torch's own modules (``verdicts``: by id, so far)."""
    verdict = verdicts.get(id(module))
    if verdict is None:
        verdict = (type(module).__module__.split(".")[0] == "torch"
                   and all(_only_torch_modules(child, verdicts) for child in module.children()))
        verdicts[id(module)] = verdict
    return verdict


_reaching_autograd: dict[Any, bool] = {}  # only for torch's own targets, which live as long as torch


def _may_reach_autograd(target: Any) -> bool:
    try:
        return _reaching_autograd[target]
    except (KeyError, TypeError):
        pass
    if not owned_by_torch(target):
        return True
    module = getattr(target, "__module__", None) or ""
    reaches = _within(module, _AUTOGRAD_PACKAGES)
    try:
        _reaching_autograd[target] = reaches
    except TypeError:
        pass
    return reaches


def is_pure(op: str, target: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the result depends only on the arguments and changes nothing (and the target is
    torch's own, so an entry keeps no user object alive)."""
    if kwargs.get("out") is not None or kwargs.get("inplace") is True:
        return False
    if target is getattr and args and isinstance(args[0], torch.Tensor):
        return len(args) == 2 and args[1] in _ATTRIBUTES_THE_KEY_HOLDS
    if op == "call_module":
        return (owned_by_torch(type(target)) and type(target).__module__.startswith("torch.nn.")
                and not getattr(target, "inplace", False))
    key = (op, target)
    try:
        return _purity[key]
    except KeyError:
        pure = _judge_purity(op, target)
        if pure or owned_by_torch(target):
            _purity[key] = pure
        return pure
    except TypeError:
        return False


_EFFECTS_OUTSIDE = frozenset({print, input, open, exec, eval, compile, breakpoint, __import__, setattr, delattr,
                              torch.manual_seed, torch.seed, torch.set_rng_state, torch.save, torch.load,
                              # forward-AD levels are process-wide: entering one refuses inside the caller's
                              *dual_level_ops,
                              torch.autograd.forward_ad.enter_dual_level, torch.autograd.forward_ad.exit_dual_level})
# Process-wide settings a propagation puts back as they were (`Propagation.run`): a graph that sets
# them leaves nothing changed, replayed or walked. Any other setter (use_deterministic_algorithms,
# set_num_threads) stays set after a walk, as after real execution, so a replay would differ.
_SETTINGS_PUT_BACK = frozenset({set_grad_enabled_op, torch.set_default_dtype, set_fwd_grad_enabled_op})
_replayable: dict[tuple[str, Any], bool] = {}  # only for torch's own targets, which live as long as torch


def replayable_target(op: str, target: Any) -> bool:
    """Whether a node calling ``target`` does, each time it runs, nothing but what its graph's
    annotations record: a target torch owns, outside the functorch transforms (they push and pop
    levels) and without effects beyond the propagation (printing, files, the random seed)."""
    key = (op, target)
    try:
        return _replayable[key]
    except KeyError:
        pass
    except TypeError:
        return False
    if op == "call_method":
        replayable = isinstance(target, str)
    elif not owned_by_torch(target):
        replayable = False
    else:
        module, name = _module_name(target), _attribute(target, "__name__") or ""
        replayable = (target not in _EFFECTS_OUTSIDE and target not in _IMPURE_TENSOR_METHODS
                      and not _within(module, _STATEFUL_PACKAGES)
                      and (not name.startswith(_SETTERS) or target in _SETTINGS_PUT_BACK))
    if replayable:
        _replayable[key] = True
    return replayable


def returns_several_views(op: str, target: Any) -> bool:
    """Whether ``target`` returns several views of its input (``split``, ``chunk``, ``unbind``, and
    ``torch.split``, a python function that calls them): autograd restricts them in place whatever
    their input, which no view made afresh is."""
    key = (op, target)
    try:
        return _several_views[key]
    except KeyError:
        pass
    except TypeError:
        return False
    if isinstance(target, OpOverload):
        overloads = [target]
    else:
        name = target if op == "call_method" and isinstance(target, str) else (
            getattr(target, "__name__", None) if callable(target) and owned_by_torch(target) else None)
        packet = getattr(torch.ops.aten, name, None) if isinstance(name, str) else None
        overloads = [getattr(packet, o) for o in packet.overloads()] if isinstance(packet, OpOverloadPacket) else []
        overloads = [overload for overload in overloads if _returns_tensors(overload)]  # not ``split.str``
    several = bool(overloads) and all(_returns_several_tensors(overload) and _returns_views(overload)
                                      for overload in overloads)
    if owned_by_torch(target):
        _several_views[key] = several
    return several


def _returns_tensors(op: OpOverload) -> bool:
    return any("Tensor" in str(result.type) for result in schema_of(op).returns)


def _returns_views(op: OpOverload) -> bool:
    return all(result.alias_info is not None and not result.alias_info.is_write for result in schema_of(op).returns)


def _returns_several_tensors(op: OpOverload) -> bool:
    returns = schema_of(op).returns
    return len(returns) > 1 or any("Tensor" in str(result.type) and str(result.type) != "Tensor" for result in returns)


def reads_process_state(node: torch.fx.Node, value: Any) -> bool:
    """Whether a node's value may be the process's state rather than a function of the graph: a
    call_function of nothing from the graph whose value is a python value (``torch.initial_seed()``,
    ``torch.get_float32_matmul_precision()``). Such a value is neither memoized nor replayed: the
    keys hold the settings fxprop's rules read, not every one torch can report."""
    return (node.op == "call_function" and value is not None and not node.all_input_nodes
            and not isinstance(value, torch.Tensor) and not any(isinstance(item, torch.Tensor)
                                                                for item in pytree.tree_leaves(value)))


def owned_by_torch(target: Any) -> bool:
    """Whether ``target`` is torch's own (or python's operators and builtins), so that a table keeping
    it keeps nothing of the user's alive and what it computes depends only on its arguments: an op,
    or a function, builtin, method descriptor or class defined in torch or python, bound to no object
    and to no class of the user's (``MyTensor.__torch_function__``, a user Function's ``apply``)."""
    if isinstance(target, (str, OpOverload, OpOverloadPacket, HigherOrderOperator)):
        return True
    return (isinstance(target, _PLAIN_CALLABLES) and not bound_to_an_object(target)
            and _module_is_torchs(target) and _named_by_its_module(target))


def _module_is_torchs(owner: Any) -> bool:
    return _module_name(owner).split(".")[0] in _TORCH_MODULES


def _module_name(owner: Any) -> str:
    module = _attribute(owner, "__module__")
    return module if isinstance(module, str) else ""


def _attribute(owner: Any, name: str) -> Any:
    """``getattr(owner, name, None)``, None too where reading it raises (a user's metaclass may make
    ``__module__`` or ``__qualname__`` a property that does): such a target is not torch's."""
    try:
        return getattr(owner, name, None)
    except Exception:
        return None


def _named_by_its_module(target: Any) -> bool:
    """Whether ``target``'s module names it (by its qualified name or its name), as it names its
    functions and classes for good. Not named there: a user's wrapper of a torch function
    (``functools.wraps`` copies the wrapped one's ``__module__``), a closure torch made around a
    user's function (``torch.func.grad(f)``), a class torch made around a user's class (a
    parametrized module's, a Function's backward); each holds what the user gave it."""
    module = sys.modules.get(_module_name(target))
    qualname, name = _attribute(target, "__qualname__"), _attribute(target, "__name__")
    if module is None or not isinstance(qualname, str) or not isinstance(name, str):
        return False
    function = _attribute(target, "__func__") or target
    # Looked up in the namespaces themselves: torch's module ``__getattr__`` imports submodules.
    found: Any = module
    for part in qualname.split("."):
        found = _own_namespace(found).get(part)
    named = _own_namespace(module).get(name)
    return any(candidate is not None and (_attribute(candidate, "__func__") or candidate) is function
               for candidate in (found, named))


def _own_namespace(owner: Any) -> dict:
    namespace = _attribute(owner, "__dict__")
    return namespace if isinstance(namespace, (dict, types.MappingProxyType)) else {}


def bound_to_an_object(target: Any) -> bool:
    """A method bound to an object (``linear.forward``, ``tensor.add``) or to a user's class: what it
    computes depends on the object's state (a module's parameters, the user's code it holds), which no
    key holds, and a table that keeps it keeps the object alive. Ask it of anything but an op: an
    OpOverloadPacket's ``__self__`` is its C++ function's record."""
    owner = _attribute(target, "__self__")
    if owner is None or isinstance(owner, types.ModuleType):
        return False
    return not isinstance(owner, type) or not _module_is_torchs(owner)


def _named_in_place(name: str) -> bool:
    """torch's naming of an in-place op (``resize_``), which a schema may not annotate as mutating
    (``inductor::resize_storage_bytes_(Tensor variable, SymInt new_size) -> ()``); ``__and__`` is not one."""
    return name.endswith("_") and not name.endswith("__")


def _judge_purity(op: str, target: Any) -> bool:
    if op == "call_method":
        return isinstance(target, str) and not target.endswith("_") and target not in _IMPURE_METHODS
    if isinstance(target, OpOverload):
        return (not schema_of(target).is_mutable and not _named_in_place(schema_of(target).name)
                and torch.Tag.nondeterministic_bitwise not in target.tags)
    if isinstance(target, OpOverloadPacket):
        return not any(schema_of(getattr(target, o)).is_mutable or _named_in_place(schema_of(getattr(target, o)).name)
                       for o in target.overloads())
    if not owned_by_torch(target) or target in _IMPURE_CALLS:
        return False
    module, name = _module_name(target), _attribute(target, "__name__") or ""
    if module in ("_operator", "operator") and name in _IN_PLACE_OPERATORS:
        return False
    if name.startswith(_SETTERS):
        return False  # set_default_dtype, set_grad_enabled, use_deterministic_algorithms: process-wide state
    if _within(module, _AUTOGRAD_PACKAGES):
        return False  # autograd.grad, backward: the result is the autograd graph's, which no key holds
    return not name.endswith("_") and "autocast" not in module and not _within(module, _STATEFUL_PACKAGES)
