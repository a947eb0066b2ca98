"""The code's import structure: no import circles in host_tools/ or on the board (micro/utrain).

An import circle (a imports b, b imports a, directly or through others) makes a reader go back
and forth and hides which module is the lower layer.  The imports are read with ast from the
source, lazy ones inside functions included; ``__import__('utrain.' + name)`` and
``importlib.import_module`` calls with a computed name are not imports a reader sees and are
not followed.
"""
import ast
import os

import pytest

from repo import ROOT  # noqa: E402


def modules(top, package):
    """{dotted module name: path} for every .py file below ROOT/top, named as `package`."""
    found = {}
    base = os.path.join(ROOT, top)
    for dirpath, dirnames, files in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in ('__pycache__', 'node_modules')
                             and not d.startswith('.'))
        for f in sorted(files):
            if not f.endswith('.py'):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].split(os.sep)
            if rel[-1] == '__init__':
                rel = rel[:-1]
            found['.'.join([package] + rel)] = os.path.join(dirpath, f)
    return found


def imports(name, path, known):
    """The modules of `known` that the module `name` (file `path`) imports, anywhere in it."""
    is_pkg = path.endswith('__init__.py')
    here = name.split('.') if is_pkg else name.split('.')[:-1]
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    out = set()

    def add(mod):
        # the longest known prefix: `from a.b import c` imports a.b (and a.b.c if it is a module)
        parts = mod.split('.')
        while parts and '.'.join(parts) not in known:
            parts.pop()
        if parts and '.'.join(parts) != name:
            out.add('.'.join(parts))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                mod = '.'.join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:              # `from . import x` / `from .pkg import sub`
                full = mod + '.' + a.name
                if full in known:
                    add(full)
                else:
                    add(mod)
    return out


def circles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def graph_of(top, package):
    known = modules(top, package)
    return {m: imports(m, p, known) for m, p in known.items()}


def describe(graph, comp):
    """'a -> b, b -> a' for the arrows inside one circle, so the failure names them."""
    return ', '.join(f'{a} -> {b}' for a in comp for b in sorted(graph[a]) if b in comp)


@pytest.mark.parametrize('top,package', [('host_tools', 'host_tools'), ('micro/utrain', 'utrain')])
def test_no_import_circles(top, package):
    g = graph_of(top, package)
    assert len(g) > 10, f'read only {len(g)} modules under {top}'
    found = circles(g)
    assert not found, f'import circles in {top}/: ' + '; '.join(
        f'[{describe(g, c)}]' for c in found)


def test_the_reader_finds_circles():
    """The checker's own case: a circle through a lazy import inside a function, and one
    through `from . import x`, are found and named; a plain chain is not a circle."""
    import tempfile
    global ROOT
    saved = ROOT
    with tempfile.TemporaryDirectory() as d:
        pkg = os.path.join(d, 'pkg')
        os.makedirs(os.path.join(pkg, 'sub'))
        files = {'__init__.py': '', 'a.py': 'from .b import f\n',
                 'b.py': 'def f():\n    from .c import g\n', 'c.py': 'from pkg import a\n',
                 'd.py': 'from . import e\n', 'e.py': 'import pkg.sub.x\n',
                 'sub/__init__.py': '', 'sub/x.py': 'from .. import d\n',
                 'z.py': 'from .a import f\nimport os\n'}
        for f, text in files.items():
            with open(os.path.join(pkg, f), 'w') as fh:
                fh.write(text)
        ROOT = d
        try:
            g = graph_of('pkg', 'pkg')
        finally:
            ROOT = saved
    found = circles(g)
    assert found == [['pkg.a', 'pkg.b', 'pkg.c'], ['pkg.d', 'pkg.e', 'pkg.sub.x']], found
    assert describe(g, found[0]) == 'pkg.a -> pkg.b, pkg.b -> pkg.c, pkg.c -> pkg.a'


def test_every_board_module_is_on_the_map_and_in_the_package():
    """micro/README.md names every board module, and micro/package.json (mip) ships it:
    a module added to micro/utrain without either is one a reader cannot place or a
    `mip install` leaves out."""
    import json
    mods = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, 'micro', 'utrain'))
                  if n.endswith('.py') and n != '__init__.py')
    with open(os.path.join(ROOT, 'micro', 'README.md')) as f:
        text = f.read()
    assert [m for m in mods if '`%s`' % m not in text] == []
    with open(os.path.join(ROOT, 'micro', 'package.json')) as f:
        urls = {u[0] for u in json.load(f)['urls']}
    assert [m for m in mods if 'utrain/%s.py' % m not in urls] == []
