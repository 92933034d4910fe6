"""The plugin's model zoo: the OpenMMLab model index of its configs and the published checkpoints they evaluate.

``model-index.yml`` (repository root; ``mmplugin/.mim/model-index.yml`` in the package, which is what ``mim search
mmplugin`` reads) imports one metafile per config family, beside its configs (``configs/<family>/metafile.yml``). Each
metafile has the OpenMMLab layout: ``Collections`` (the family: paper, code, training data) and ``Models``, one per
published checkpoint and one per config without any. A model with a checkpoint has ``Weights`` (its URL), ``Results``
(the publisher's numbers for it) and ``Source`` (who published URL and numbers, at which commit or release); a config
without one has neither, says why in ``No Weights``, and ``Paper Results`` holds the paper's numbers where the paper
reports any (numbers no downloadable file reproduces). Every entry evaluates with::

    python tools/test.py CONFIG WEIGHTS

This module reads the index and the Markdown tables of ``docs/model_zoo.md`` (the same figures for people).
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ['index_file', 'load_models', 'get_model', 'read_markdown_table']


def index_file() -> Path:
    """``<package>/.mim/model-index.yml`` (a link to the repository's ``model-index.yml`` in a source tree)."""
    path = Path(__file__).resolve().parent / '.mim' / 'model-index.yml'
    if not path.is_file():
        raise FileNotFoundError(
            f'the model index is missing: {path} does not exist. In a source checkout it is a link to the '
            "repository's model-index.yml (restore it with `git checkout mmplugin/.mim`); a wheel ships the file "
            'there (rebuild it with `python -m build`).')
    return path


def _load_yaml(path: Path):
    import yaml
    with open(path, encoding='utf-8') as f:
        return yaml.safe_load(f)


def load_models(index: str | Path | None = None) -> list[dict]:
    """Every model of the index, in metafile order, as the metafile's dict plus ``'Collection'`` (the dict of its
    ``In Collection``) and ``'Metafile'`` (the path of the file it came from).

    Raises ValueError for an import that is missing, a model whose collection is not defined in its metafile, and a
    name used twice (``mim download mmplugin --config NAME`` needs unique names)."""
    index = Path(index) if index is not None else index_file()
    data = _load_yaml(index)
    if not isinstance(data, dict) or not isinstance(data.get('Import'), list) or not data['Import']:
        raise ValueError(f'{index}: expected a mapping with a non-empty "Import" list of metafiles')
    models, seen = [], {}
    for rel in data['Import']:
        meta = index.parent / rel
        if not meta.is_file():
            raise ValueError(f'{index}: imports {rel}, which does not exist ({meta})')
        content = _load_yaml(meta) or {}
        collections = {c['Name']: c for c in content.get('Collections') or []}
        for model in content.get('Models') or []:
            name = model.get('Name')
            if name in seen:
                raise ValueError(f'model name {name!r} appears in {seen[name]} and {rel}')
            seen[name] = rel
            coll = model.get('In Collection')
            if coll not in collections:
                raise ValueError(f'{rel}: model {name!r} is "In Collection: {coll}", which {rel} does not define '
                                 f'(collections: {sorted(collections)})')
            models.append({**model, 'Collection': collections[coll], 'Metafile': str(meta)})
    return models


def get_model(name: str, index: str | Path | None = None) -> dict:
    """The model called ``name`` (see :func:`load_models`); KeyError listing the names otherwise."""
    models = load_models(index)
    for model in models:
        if model['Name'] == name:
            return model
    raise KeyError(f'no model {name!r} in the model index; models: {", ".join(m["Name"] for m in models)}')


_HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith('|'):
        line = line[1:]
    if line.endswith('|'):
        line = line[:-1]
    return [c.strip() for c in line.split('|')]


def read_markdown_table(text: str, heading: str) -> list[dict[str, str]] | None:
    """The first pipe table in the section of ``text`` whose heading reads ``heading`` (any level), as one dict per
    row keyed by the header cells. None when no heading reads ``heading``; ValueError when the section holds no
    table (before the next heading of the same or a higher level) or a row has the wrong number of cells."""
    lines = text.splitlines()
    start = level = None
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m and m.group(2) == heading:
            start, level = i + 1, len(m.group(1))
            break
    if start is None:
        return None
    table: list[str] = []
    for line in lines[start:]:
        m = _HEADING.match(line)
        if m and len(m.group(1)) <= level:
            break
        if line.lstrip().startswith('|'):
            table.append(line)
        elif table:
            break
    if len(table) < 2 or not re.fullmatch(r'[\s|:\-]+', table[1]):
        raise ValueError(f'the section "{heading}" has no Markdown table (a header row, then a |---| row)')
    header = _cells(table[0])
    rows = []
    for line in table[2:]:
        cells = _cells(line)
        if len(cells) != len(header):
            raise ValueError(f'"{heading}" table: {len(cells)} cells where the header has {len(header)}: {line}')
        rows.append(dict(zip(header, cells)))
    return rows


def main(argv=None) -> int:
    """``python -m mmplugin.zoo [WORD ...]``: one line per model of the index (name, config, weights or why none),
    the models whose name or config contains every WORD; what ``mim search mmplugin`` lists, without openmim."""
    import argparse
    p = argparse.ArgumentParser(prog='python -m mmplugin.zoo', description=main.__doc__)
    p.add_argument('words', nargs='*', help='keep the models whose name or config contains all of these')
    args = p.parse_args(argv)
    rows = [m for m in load_models()
            if all(w.lower() in f"{m['Name']} {m.get('Config', '')}".lower() for w in args.words)]
    for m in rows:
        weights = m.get('Weights') or f"(no weights: {m.get('No Weights', '')})"
        print(f"{m['Name']}  {m.get('Config', '')}  {weights}")
    print(f'{len(rows)} of {len(load_models())} models')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
