"""The package's shape: private torch names in one module, an import graph without cycles."""
import ast
import inspect
import subprocess
import sys
from pathlib import Path

import networkx as nx

import fxprop
from fxprop import torch_compat

PACKAGE = Path(fxprop.__file__).parent


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text(), str(path))


def _is_private(dotted: str) -> bool:
    return any(part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
               for part in dotted.split("."))


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def private_torch_names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("torch") and _is_private(alias.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            found += [f"{node.module}.{alias.name}" for alias in node.names
                      if _is_private(f"{node.module}.{alias.name}")]
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] == "torch" and not dotted.startswith("torch.ops.") \
                    and _is_private(dotted):  # an operator's name is public, underscore or not
                found.append(dotted)
    return found


def test_no_module_but_torch_compat_reaches_a_private_torch_name():
    offenders = {}
    for name, _, tree in modules():
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child.parent = node
        if name != "fxprop.torch_compat":
            names = private_torch_names(tree)
            if names:
                offenders[name] = sorted(set(names))
    assert offenders == {}


def test_the_scan_sees_each_way_of_reaching_a_private_name():
    source = "import torch._dynamo\nfrom torch._ops import OpOverload\nfrom torch.utils import _pytree\nx = torch._C._nn\n"
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node
    assert sorted(private_torch_names(tree)) == ["torch._C._nn", "torch._dynamo", "torch._ops.OpOverload",
                                                 "torch.utils._pytree"]
    assert private_torch_names(ast.parse("y = torch.ops.aten._to_copy.default\nz = torch.__version__\n"
                                         "from .torch_compat import _disable_current_modes\n")) == []


def names_fxprop_defines() -> set[str]:
    """Every name fxprop binds itself: functions, classes, attributes it assigns, imports."""
    own = set()
    for _, _, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                own.update(alias.asname or alias.name.split(".")[-1] for alias in node.names)
    return own


def foreign_private_attributes(tree: ast.AST, own: set[str]) -> list[str]:
    """``obj._name`` where fxprop never defines ``_name``: another library's private attribute
    (an op's ``_schema``, a tensor's ``_version``). Operator names (``aten._softmax``) are public."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and node.attr not in own:
            dotted = _dotted(node.value) or ""
            if dotted.split(".")[-1] == "aten" or dotted.startswith("torch.ops"):
                continue
            found.append(f"{dotted or '<expr>'}.{node.attr}")
    return found


def test_no_module_but_torch_compat_reads_a_private_attribute_of_torchs_objects():
    own = names_fxprop_defines()
    offenders = {name: sorted(set(found)) for name, _, tree in modules() if name != "fxprop.torch_compat"
                 if (found := foreign_private_attributes(tree, own))}
    assert offenders == {}


def test_the_attribute_scan_sees_torchs_private_attributes():
    tree = ast.parse("op._schema.arguments\nx = t._version\ny = aten._softmax.default\nz = module._parameters\n")
    assert sorted(foreign_private_attributes(tree, set())) == ["module._parameters", "op._schema", "t._version"]


def test_the_patched_name_is_the_one_torch_consults():
    for where, (module, attribute) in torch_compat.patched_names().items():
        assert hasattr(module, attribute), f"{where} is gone: torch no longer consults it"
        consulting = [value for value in vars(module).values() if callable(value) and attribute in
                      getattr(getattr(inspect.unwrap(value), "__code__", None), "co_names", ())]
        assert consulting, f"no function in {module.__name__} reads {attribute} any more"


def test_each_op_run_as_atens_composite_still_has_a_python_kernel_and_a_composite():
    for op in torch_compat.ATEN_COMPOSITE_OVER_PYTHON_KERNEL:
        assert torch_compat.has_kernel(op.name(), "CompositeImplicitAutograd"), f"{op} has no ATen composite any more"
        assert any(key in op.py_kernels for key in torch_compat.PYTHON_KERNEL_KEYS), \
            f"torch has no python kernel for {op} any more: drop it from ATEN_COMPOSITE_OVER_PYTHON_KERNEL"


def test_importing_fxprop_patches_nothing():
    code = ("import torch, torch._meta_registrations as m; hint = m.device_hint; "
            "from torch.fx.experimental.symbolic_shapes import ShapeEnv; evaluate = ShapeEnv._evaluate_expr; "
            "dropout = dict(torch.ops.aten.dropout.default.py_kernels); import fxprop; "
            "assert m.device_hint is hint and ShapeEnv._evaluate_expr is evaluate, 'patched on import'; "
            "assert torch.ops.aten.dropout.default.py_kernels == dropout, 'patched on import'; "
            "gm = torch.fx.symbolic_trace(lambda x: x + 1); fxprop.propagate(gm, torch.ones(2)); "
            "assert m.device_hint is not hint, 'the first propagate installs the hint'; "
            "assert ShapeEnv._evaluate_expr is not evaluate, 'and the evaluation of open relations'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _imported_modules(name: str, is_package: bool, node: ast.AST, known: set) -> list[str]:
    """The fxprop modules an import statement names (a name that is not a module counts as its
    module: ``from .. import propagate`` names the package above)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "fxprop"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    elif node.module and node.module.split(".")[0] == "fxprop":
        base = node.module
    else:
        return []
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def import_graph(top_level_only: bool) -> nx.DiGraph:
    """Module -> the modules importing it runs: the imported module and the packages above it,
    except the packages above the importer, which are already being imported, unless the import
    names one of them itself (``from .. import propagate``)."""
    parsed = list(modules())
    known = {name for name, _, _ in parsed}
    graph = nx.DiGraph()
    for name, path, tree in parsed:
        graph.add_node(name)
        statements = tree.body if top_level_only else ast.walk(tree)
        for node in statements:
            for imported in _imported_modules(name, path.name == "__init__.py", node, known):
                parts = imported.split(".")
                for depth in range(1, len(parts) + 1):
                    target = ".".join(parts[:depth])
                    named = depth == len(parts)
                    if target != name and (named or not name.startswith(target + ".")):
                        graph.add_edge(name, target)
    return graph


def test_imports_form_no_cycle_counting_those_inside_functions():
    """A cycle makes ``import fxprop`` depend on the order in which modules happen to be imported;
    one through an import inside a function is a layer that reaches up past its place."""
    assert list(nx.simple_cycles(import_graph(top_level_only=False))) == []


def test_the_cycle_check_sees_imports_inside_functions_and_of_the_package_above():
    graph = import_graph(top_level_only=False)
    assert graph.has_edge("fxprop.engine.propagation", "fxprop.resolve.registry")
    assert "fxprop.rules" in nx.descendants(graph, "fxprop")  # fxprop/__init__ loads every rule family
    tree = ast.parse("def f():\n    from .. import propagate\n    from .symbolic import shape_of\n")
    named = [found for node in ast.walk(tree)
             for found in _imported_modules("fxprop.estimate", True, node, {"fxprop.estimate.symbolic"})]
    assert named == ["fxprop", "fxprop.estimate.symbolic"]


def in_the_testing_kit(name: str) -> bool:
    return name == "fxprop.pytest_plugin" or name.split(".")[:2] in (["fxprop", "testing"], ["fxprop", "conformance"])


def test_library_code_does_not_import_the_testing_kit():
    graph = import_graph(top_level_only=False)
    importers = {name for name in graph if not in_the_testing_kit(name) and name != "fxprop"
                 and any(in_the_testing_kit(imported) for imported in graph.successors(name))}
    assert importers == set()


def test_no_module_is_longer_than_500_lines_without_saying_why():
    long = [f"{name} ({lines} lines)" for name, path, _ in modules()
            if (lines := len(path.read_text().splitlines())) > 500
            and "Longer than 500 lines because" not in path.read_text()[:3000]]
    assert long == []


def test_a_rule_module_imports_neither_the_engine_nor_the_package():
    """Rules are leaves: they see the registry and helpers, never the engine that runs them."""
    graph = import_graph(top_level_only=False)
    for name in graph:
        if name.startswith("fxprop.rules."):
            assert not {"fxprop.engine.propagation", "fxprop.engine.walk", "fxprop.engine.dispatch", "fxprop.resolve.order"} & set(graph.successors(name)), name


def test_the_architecture_page_names_every_package_and_top_level_module():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    tree = {f"fxprop/{path.name}/" for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    tree |= {f"fxprop/{path.name}" for path in PACKAGE.glob("*.py")}
    assert {entry for entry in tree if f"`{entry}`" not in page} == set()


def test_the_fake_mode_built_without_dynamo_is_the_one_torch_builds():
    """`torch_compat.fake_mode_without_dynamo` builds FakeTensorMode as its constructor does,
    without the import of torch._dynamo the constructor makes; a torch upgrade that changes the
    constructor shows here: every attribute, with the same value where it is a plain setting."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from fxprop import torch_compat
    ours, torchs = torch_compat.fake_mode_without_dynamo(), FakeTensorMode(allow_non_fake_inputs=True)
    assert sorted(vars(ours)) == sorted(vars(torchs))
    for name, value in vars(torchs).items():
        if isinstance(value, (bool, int, str, type(None), torch._C._TorchDispatchModeKey)):
            assert vars(ours)[name] == value, name
    assert type(ours.fake_tensor_converter) is type(torchs.fake_tensor_converter)


def test_the_fake_tensors_fxprop_builds_are_the_ones_torch_builds():
    """`FakeTensorFactory` builds a mode's later FakeTensors from the state its constructor set on
    the first: a torch upgrade that sets more (or sets it elsewhere) shows here."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from fxprop.engine.metadata import FakeTensorFactory
    from fxprop import torch_compat
    mode = torch_compat.fake_mode_without_dynamo()
    factory = FakeTensorFactory(mode)
    factory(torch.empty(2, device="meta"), torch.device("cpu"))
    cuda = torch.device("cuda", 1)
    ours = factory.from_snapshot(torch.empty(2, 3, device="meta"), cuda, True)
    torchs = FakeTensor(mode, torch.empty(2, 3, device="meta"), cuda, requires_grad=True)
    assert sorted(vars(ours)) == sorted(vars(torchs))
    for name, value in vars(torchs).items():
        assert vars(ours)[name] is value or vars(ours)[name] == value, name
    assert (ours.device, ours.requires_grad, ours.fake_mode) == (cuda, True, mode)
    assert torch.Tensor._make_subclass(FakeTensor, torch.empty(1, device="meta")).__dict__ == {}  # nothing to keep


def test_a_first_propagate_in_a_fresh_process_does_not_import_dynamo():
    """Without torch.compile or torch.export in the process, propagating imports no torch._dynamo
    (0.4 s and 45 MB on a cold start): the values' FakeTensorMode is built without it, and
    fxprop's dispatch mode runs without torch's dynamo-disabling wrapper importing it. The
    values still work as FakeTensors, and once dynamo is imported the wrapper is torch's own again.
    The same holds for torch's python references that serve as kernels (hardtanh_, clamp)."""
    import subprocess
    import sys
    program = """
import sys, torch, fxprop
from fxprop.engine.dispatch import RuleDispatch
gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.LayerNorm(8),
                                                torch.nn.ReLU6(inplace=True), torch.nn.Hardtanh(-2.0, 2.0)))
out = fxprop.propagate(gm, fxprop.TensorSpec((2, 4)))
assert "torch._dynamo" not in sys.modules
with out.fake_mode:
    assert (out @ torch.empty(8, 3)).shape == (2, 3)
assert isinstance(out.fake_mode, torch._subclasses.fake_tensor.FakeTensorMode)
import torch._dynamo
fxprop.propagate(torch.fx.symbolic_trace(lambda x: x.sin().cumsum(0)), fxprop.TensorSpec((5,)))
raw = RuleDispatch.__torch_dispatch__.__wrapped__
assert getattr(raw, "__dynamo_disable").__name__ != "until_dynamo_is_imported"
torch._refs.clamp(torch.empty(3, device="meta"), 0.0, 1.0)
from fxprop.torch_compat import _dynamo_disabling_wrappers
kernels = [wrapper.__wrapped__ for wrapper in _dynamo_disabling_wrappers([torch._refs.clamp])]
assert kernels and all(kernel.__dynamo_disable.__name__ != "until_dynamo_is_imported" for kernel in kernels)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_dynamo_compiles_torchs_python_references_alike_after_a_propagate_that_did_not_import_it():
    """A compiled function that breaks its graph at a python reference (torch's files are skipped)
    meets no frame of fxprop's while the reference's dynamo-disabling wrapper is made: the same
    graph breaks and frames as in a process that never propagated."""
    import subprocess
    import sys
    program = """
import sys, torch
if sys.argv[1] == "propagate":
    import fxprop
    fxprop.propagate(torch.fx.symbolic_trace(torch.nn.Hardtanh()), fxprop.TensorSpec((2, 4)))
    assert "torch._dynamo" not in sys.modules
import torch._refs, torch._dynamo
from torch._dynamo.utils import counters
def f(x, y):
    return (torch._refs.mul(torch._refs.add(x, y), y) * 2).sin()
torch.compile(f, backend="eager")(torch.rand(3), torch.rand(3))
print(sum(counters["graph_break"].values()), dict(counters["frames"]))
"""
    runs = [subprocess.run([sys.executable, "-c", program, argument], capture_output=True, text=True, timeout=120)
            for argument in ("propagate", "none")]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    assert runs[0].stdout == runs[1].stdout


def test_a_first_estimate_in_a_fresh_process_does_not_import_dynamo():
    """estimate's counting modes run without torch's dynamo-disabling wrapper importing it, as propagate's."""
    import subprocess
    import sys
    program = """
import sys, torch, fxprop
gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(inplace=True)))
report = fxprop.estimate(gm, fxprop.TensorSpec((2, 3, 8, 8)))
assert "torch._dynamo" not in sys.modules
assert report.flops > 0
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_dtensor_propagate_after_dynamo_is_imported_restores_torchs_wrapper_of_every_dispatch_mode():
    """DTensorDispatch's ``__torch_dispatch__`` calls RuleDispatch's through ``super()``: a first
    propagate in a fresh process lets RuleDispatch's skip torch's dynamo-disabling wrapper, and a
    DTensor propagate once dynamo is imported gives both back to torch's wrapper, as torch's
    ``_disable_dynamo`` makes it (not only DTensorDispatch's own)."""
    import subprocess
    import sys
    program = """
import sys, torch, fxprop
from torch.distributed.tensor import Shard, distribute_tensor
from fxprop.engine.dispatch import DTensorDispatch, RuleDispatch
fxprop.propagate(torch.fx.symbolic_trace(lambda x: x.sin()), fxprop.TensorSpec((5,)))
assert "torch._dynamo" not in sys.modules
raws = [cls.__dict__["__torch_dispatch__"].__wrapped__ for cls in (RuleDispatch, DTensorDispatch)]
import torch._dynamo
with fxprop.mesh_simulation((2,), device_type="cpu") as mesh:
    weight = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
    expected = (weight * 2).relu().sum(0)
    out = fxprop.propagate(torch.fx.symbolic_trace(lambda w: (w * 2).relu().sum(0)), weight)
    assert out.placements == expected.placements and out.shape == expected.shape, (out, expected)
print([getattr(raw, "__dynamo_disable", None) is raw for raw in raws])
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[False, False]", done.stdout
