"""The import graph keeps the layers docs/design.md draws.

Every ``pipexctl`` import (module level or inside a function) is read with
ast; a module may import only from its own layer or a lower one, the two
middle siblings (discovery, orchestrator) not from each other, and nothing
of the product from the test harness (pipexctl.testing) but the demo."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import pipexctl

ROOT = pathlib.Path(pipexctl.__file__).parent

# lowest first: (layer, modules), where "x." stands for every module under x
LAYERS = [
    ("base", ("pipexctl", "pipexctl.__version__", "pipexctl.errors", "pipexctl.files", "pipexctl.defaults", "pipexctl.netns", "pipexctl.indexed", "pipexctl.poller", "pipexctl.records", "pipexctl.kernel.uapi",
              "pipexctl.kernel", "pipexctl.discovery", "pipexctl.offload")),  # the package __init__s are empty
    ("model", ("pipexctl.model",)),
    ("kernel backend", ("pipexctl.kernel.",)),
    ("discovery", ("pipexctl.discovery.",)),
    ("orchestrator", ("pipexctl.orchestrator",)),
    ("offload service", ("pipexctl.offload.statefile", "pipexctl.offload.steering", "pipexctl.offload.relay",
                         "pipexctl.offload.datapath", "pipexctl.offload.ptys", "pipexctl.offload.watch",
                         "pipexctl.offload.service", "pipexctl.offload.reconcile", "pipexctl.offload.pppopts",
                         "pipexctl.offload.exits", "pipexctl.offload.report", "pipexctl.offload.paths",
                         "pipexctl.offload.endings")),
    ("interfaces", ("pipexctl.offload.server", "pipexctl.offload.protocol", "pipexctl.offload.links",
                    "pipexctl.offload.sdnotify", "pipexctl.offload.journal", "pipexctl.offload.malloc",
                    "pipexctl.offload.workers", "pipexctl.offload.gcpause",
                    "pipexctl.offload.metrics",
                    "pipexctl.offload.client", "pipexctl.offload.setupcheck",
                    "pipexctl.cli", "pipexctl.entry", "pipexctl.__main__")),
    ("harness", ("pipexctl.testing.", "pipexctl.testing", "pipexctl.demo")),
]
RANK = {"base": 0, "model": 1, "kernel backend": 2, "discovery": 3, "orchestrator": 3, "offload service": 4,
        "interfaces": 5, "harness": 6}


def layer(mod: str) -> str:
    for name, members in LAYERS:  # an exact name wins over a "x." prefix
        if mod in members:
            return name
    for name, members in LAYERS:
        if any(m.endswith(".") and mod.startswith(m) for m in members):
            return name
    raise AssertionError(f"{mod}: no layer (add it to LAYERS and to docs/design.md)")


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ("pipexctl",) + p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _names(target: str, names) -> set[str]:
    # from pkg import x: x is a module when the package has one by that name
    subs = {f"{target}.{a.name}" for a in names} & set(MODULES)
    return subs or {target}


MODULES = modules()


def imports(mod: str, path: pathlib.Path) -> set[str]:
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
                out |= _names(target, n.names)
            elif n.module and n.module.split(".")[0] == "pipexctl":
                out |= _names(n.module, n.names)
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.split(".")[0] == "pipexctl"}
    return out


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_go_down_the_layers(mod):
    mine = layer(mod)
    for dep in imports(mod, MODULES[mod]):
        theirs = layer(dep)
        assert RANK[theirs] < RANK[mine] or theirs == mine, f"{mod} ({mine}) imports {dep} ({theirs})"


def test_every_layer_is_named_in_design_md():
    text = (ROOT.parent / "docs" / "design.md").read_text()
    for name, _ in LAYERS:
        assert name in text, name


def test_the_checker_sees_a_wrong_import(tmp_path):
    bad = tmp_path / "orchestrator.py"
    bad.write_text("def f():\n    from .offload import service\n")
    deps = imports("pipexctl.orchestrator", bad)
    assert deps == {"pipexctl.offload.service"}
    assert RANK[layer("pipexctl.offload.service")] > RANK[layer("pipexctl.orchestrator")]


# private names of other modules' objects that are public API by their own
# convention: namedtuple's, ctypes' and the interpreter's
PUBLIC_UNDERSCORE = {"_fields", "_fields_", "_replace", "_asdict", "_make", "_exit", "_getframe",
                     "_debugmallocstats"}  # sys: documented, for the allocator's figures (testing.probe)


def private_reach(path: pathlib.Path) -> list[str]:
    """``x._name`` where ``x`` is not ``self``/``cls`` and ``_name`` is not an
    attribute this module itself sets on ``self`` (a class of its own)."""
    tree = ast.parse(path.read_text())
    own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
           and n.value.id == "self" and isinstance(n.ctx, ast.Store)}
    own |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    out = []
    for n in ast.walk(tree):
        if (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
                and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                and n.attr not in own and n.attr not in PUBLIC_UNDERSCORE):
            out.append(f"{path.name}:{n.lineno}: {ast.unparse(n)}")
    return out


def test_no_module_reaches_into_another_modules_private_names():
    """A module uses another's objects through their public names (the
    design's rule: Tracker's facts API, the service's locks, procscan's
    reader), so a private name can change where it is defined."""
    found = [hit for p in modules().values() for hit in private_reach(p)]
    assert found == [], "\n".join(found)


def test_the_private_name_check_sees_a_reach(tmp_path):
    p = tmp_path / "probe.py"
    p.write_text("from pipexctl.discovery import procscan\nx = procscan._hidden(1)\n"
                 "class C:\n    def __init__(self):\n        self._mine = 1\n\ndef f(c):\n    return c._mine\n")
    assert private_reach(p) == ["probe.py:2: procscan._hidden"]


def test_importing_the_cli_and_the_daemon_starts_no_process():
    """Every CLI command and every daemon start imports these: a process
    started at import (ctypes.util.find_library runs `ldconfig -p`) is a
    fork and exec each time."""
    code = ("import subprocess, sys\n"
            "started = []\n"
            "real = subprocess.Popen.__init__\n"
            "def spy(self, args, *a, **kw):\n"
            "    started.append(args)\n"
            "    real(self, args, *a, **kw)\n"
            "subprocess.Popen.__init__ = spy\n"
            "import pipexctl.cli, pipexctl.offload.server, pipexctl.kernel.backend, pipexctl.netns\n"
            "print(started)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(pathlib.Path(pipexctl.__file__).parent.parent))
    assert out.stdout.strip() == "[]", out.stdout
