"""The import rules of docs/architecture.md ("Layers"), checked by an ast scan of every module.

schedules: standard library only; topologies: networkx + standard library; kernels:
schedules + torch (+ numpy) only, never sim or topologies; sim may import anything of
ours but torch, and kernels only lazily (inside functions). Every package may import the
package root's `user_files` (the one reader of user-handed files), which imports the
standard library only.
"""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = {"schedules", "topologies", "sim", "kernels"}
SHARED = "user_files"  # clustersim.user_files, at the package root
ALLOWED_THIRD_PARTY = {
    "schedules": set(),
    "topologies": {"networkx"},
    "sim": {"simpy", "networkx", "numpy", "plotly", "yaml", "tomli", "tqdm", "tabulate",
            "chakra", "pandas", "joblib", "ray", "distributed", "pyarrow"},  # config
    # files, progress, tables; Chakra traces (the chakra extra); the planner's DataFrame;
    # parallel replays and sweeps (sim.backends: joblib, and the sweep extra's Ray, Dask,
    # and pyarrow for Parquet tables)
    "kernels": {"torch", "numpy"},
}
ALLOWED_OURS = {
    "schedules": {"schedules"},
    "topologies": {"topologies"},
    "sim": {"schedules", "topologies", "sim", "clustersim"},  # the root: __version__
    "kernels": {"schedules", "kernels"},
}


def _imports(path: Path):
    """(package, is_module_level) of every absolute import in the file: our packages by
    their folder name (`clustersim.sim.engine` -> 'sim'), others by their top name."""
    tree = ast.parse(path.read_text(), str(path))
    module_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "clustersim" and len(parts) > 1:
                parts = parts[1:]
            yield parts[0], id(node) in module_level


def test_import_rules():
    stdlib = sys.stdlib_module_names
    problems = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, top_level in _imports(path):
                if name in stdlib or name in ALLOWED_OURS[package] or name == SHARED:
                    continue
                if name in ALLOWED_THIRD_PARTY[package]:
                    continue
                if package == "sim" and name == "kernels" and not top_level:
                    continue  # hardware commands import kernels lazily
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "\n".join(problems)


def test_the_shared_file_reader_imports_the_standard_library_only():
    names = [name for name, _ in _imports(ROOT / f"{SHARED}.py")]
    assert names and all(name in sys.stdlib_module_names for name in names), names


def _loaded(modules: str, watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter has imported after `import {modules}`."""
    code = f"import sys, {modules}; print(sorted(m for m in {watched!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_simulating_does_not_import_torch():
    assert _loaded("clustersim, clustersim.sim.cli, clustersim.sim.simulate, "
                   "clustersim.sim.gantt, clustersim.sim.trace", ("torch",)) == []


def test_the_cli_starts_without_the_cluster_libraries():
    """Ray, Dask, pyarrow and joblib are imported only when a sweep or a plan uses them
    (sim.backends, sim.sweep_table)."""
    assert _loaded("clustersim.sim.cli, clustersim.sim.backends",
                   ("ray", "distributed", "dask", "pyarrow", "joblib")) == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(("clustersim", *parts))


def _our_imports(path: Path, modules: set[str]) -> set[str]:
    """Our modules `path` imports anywhere in it (module level, functions, TYPE_CHECKING
    blocks): `from pkg import name` counts as pkg, and as pkg.name when that is a module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def test_no_import_cycle_not_even_under_type_checking():
    paths = [p for package in OURS for p in (ROOT / package).rglob("*.py")]
    modules = {_module_name(p) for p in paths} | {"clustersim"}
    graph = {_module_name(p): _our_imports(p, modules) for p in paths}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, graph) if c]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
