"""The command lines of ``tools/*.py``: one module per tool, each with ``main(argv=None)`` (argument parsing, then
calls into the package: :mod:`mmplugin.apis`, :mod:`mmplugin.analysis`, :mod:`mmplugin.deploy`, ...), wrapped by
:func:`mmplugin.cli.common.tool_main` so that a user's mistake ends as one ``error: ...`` line with exit code 2.

``tools/<name>.py`` runs ``mmplugin.cli.<name>.main``; so does ``python -m mmplugin.cli.<name>``. Tests call the
``main`` functions in-process with an argument list.
"""
